// Prefill on tensor cores without giving up fp32 (internal to xpack_kernels;
// quant_matmul.cu calls it for the types it supports).
//
// Why it is exact enough to be the default: for the supported types every weight
// is a small integer q times a per-32-element scale s (MXFP4: q*2^(e-128), folded
// into the bf16 value, which stays exact; Q8_0: an int8 times the block's fp16 d).
// The integer part is exact in bf16. Each fp32 activation is split into three
// bf16 terms whose sum is the activation exactly (8 + 8 + 8 significant bits), so
// every product on the tensor cores is exact and only the fp32 accumulation
// rounds: the same error bound as the fp32 SGEMM path (tested: 1e-5 * sum|w*x|).
// The weights are decoded from their blocks into shared memory tile by tile and
// never materialised in global memory (the fp32 tile path writes and reads 8x the
// MXFP4 bytes per product).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant_matmul.h"

namespace xpack::kernels::dev {

// Whether mma_grouped() takes this weight type.
bool mma_supports(uint32_t type);

// y rows [p.row, p.row + p.n_tokens) = W_p x rows, for n problems (<= 128) of
// any token count in ONE launch. x [n_rows][ne0], y [n_rows][ne1], ne0 a whole
// number of 32-element blocks, x 16-byte aligned. Each output depends on its
// problem alone (the same bits whatever else is in the launch). Arguments are
// checked by the caller.
int mma_grouped(uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* problems, int n,
                const float* x, float* y, cudaStream_t stream);

}  // namespace xpack::kernels::dev
