// Block-wide reductions shared by the runtime's kernels (runtime_ops.cu,
// ds4_ops.cu): every thread of the block calls them and gets the result.
// blockDim.x must be a multiple of 32 (at most 1024). Sums are in double so a
// row's total does not depend on the launch shape beyond double rounding.
#pragma once

#include <cmath>

namespace xpack::rt {

__device__ inline double block_sum(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double s = 0.0;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) s += part[w];
  return s;
}

__device__ inline float block_max(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, part[w]);
  return m;
}

}  // namespace xpack::rt
