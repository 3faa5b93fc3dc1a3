// Products of F32 weights and a batch of fp32 activations (internal to
// xpack_kernels; quant_matmul.cu's matmul() calls it for F32 weights beyond
// decode). Plain fp32 FMA, no cuBLAS: the routers' and hyper-connections'
// products are too narrow (24 or 256 rows) for a tile grid to fill the GPU
// without splitting the inputs, and cuBLAS's SGEMM held the host inside each
// such call about as long as the GPU ran it (doc/benchmarks.md, 2026-12-03).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace xpack::kernels::dev {

// y[t][r] = sum_k w[r][k] x[t][k], for w [ne1][ne0] and x [n][ne0], y [n][ne1],
// all fp32 row-major. Where the tiles are too few for the GPU the inputs are
// split into parts summed in `scratch` (scratch_bytes of it) and added in a
// fixed order by a second launch: the result is the same bits on every run.
// Each output's error is that of an fp32 dot product (tested: 1e-5 * sum|w*x|).
// Arguments are checked by the caller; returns kOk or kErrCuda.
int f32_gemm(const float* w, int64_t ne0, int64_t ne1, const float* x, int64_t n, float* y, float* scratch,
             size_t scratch_bytes, cudaStream_t stream);

}  // namespace xpack::kernels::dev
