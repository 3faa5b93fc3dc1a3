// Prefill on tensor cores without giving up fp32 (internal to xpack_kernels;
// quant_matmul.cu calls it for the types it supports).
//
// Why it is exact enough to be the default: for the supported types every weight
// is a small integer times a scale shared by 16 or 32 inputs, and the integer is
// exact in bf16 (8 significant bits):
//   MXFP4  code * 2^(e-128): the power of two is folded into the bf16 value, which
//          stays exact (also subnormal, also the overflow to inf of e = 253, 254);
//   Q8_0   int8 * d: the block's sums are multiplied by d;
//   Q3_K   (6-bit scale * 3-bit quant, |.| <= 128) * d;
//   Q2_K   (4-bit scale * 2-bit quant) * d - dmin * min: the min term is applied
//          to each 16-input sub-block's sum of x, in fp32.
// Each fp32 activation is split into three bf16 terms whose sum is the
// activation exactly (8 + 8 + 8 significant bits), so every product on the
// tensor cores is exact and only the fp32 accumulation rounds: the fp32 SGEMM
// path's error bound holds (tested: 1e-5 * sum|w*x|). The weights are decoded
// from their blocks into shared memory tile by tile and never materialised in
// global memory (the fp32 tile path writes and reads 8x the MXFP4 bytes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant_matmul.h"

namespace xpack::kernels::dev {

// Whether mma_grouped() takes this weight type.
bool mma_supports(uint32_t type);

// How many rows of x the split activations of a workspace of this size hold (0:
// not one, or rows longer than the tiles take, 2^23 inputs; the product then needs
// another path). Each input takes 6 bytes (its three bf16 terms), and for Q2_K each
// 16 inputs 4 more (their sum).
int64_t mma_split_rows(uint32_t type, int64_t ne0, size_t workspace_bytes);

// The least workspace whose mma_split_rows() is rows (0 for a type the tiles do
// not take).
size_t mma_split_bytes(uint32_t type, int64_t ne0, int64_t rows);

// y rows [p.row, p.row + p.n_tokens) = W_p x rows, for n problems (<= 128) of
// any token count: per batch of problems whose split activations fit the
// workspace, one launch that splits them and one per tile shape (three at most:
// problems of up to 16 tokens get 128-row x 16-token tiles, those of many tokens
// on a large grid 128 x 64, the others 64 x 32; quant_mma.cu's launch_split() has
// the rule and its measurements). x [n_rows][ne0], y [n_rows][ne1], ne0 a whole
// number of blocks, x and every w 16-byte aligned, the workspace 256-byte
// aligned and free until the launches end (stream order). Each output depends
// on its problem alone, not on its tile, its batch or the workspace's size (the
// same bits whatever else is in the launch). kErrWorkspace where
// mma_split_rows() is 0; other arguments are checked by the caller.
int mma_grouped(uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* problems, int n,
                const float* x, float* y, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// set_mma_large_from(n), n > 0: problems of n tokens or more take the 128 x 64
// tiles whatever the grid (a huge n: never); n <= 0: the rule (the default).
// mma_large_from() is the n in force, 0 for the rule. For bench-kernels'
// side-by-side runs and the tests (the bits do not change).
// Thread safety: safe from any thread; launches already enqueued keep theirs.
int mma_large_from();
void set_mma_large_from(int n);

}  // namespace xpack::kernels::dev
