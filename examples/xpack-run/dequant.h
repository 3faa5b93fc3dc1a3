// Exact decoders of the GGUF weight formats (dequant.cpp, compiled without FMA
// contraction so that they match ggml's reference decoders bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>

namespace xrun {

// Dequantizes n consecutive elements (n a multiple of the type's block size)
// of ggml type `type` starting at `src` (which must point at a block start).
// Supports F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, I32 (as float).
void dequantize(uint32_t type, const void* src, float* dst, int64_t n);

// Bytes of one row of ne0 elements of `type`.
size_t row_bytes(uint32_t type, int64_t ne0);

}  // namespace xrun
