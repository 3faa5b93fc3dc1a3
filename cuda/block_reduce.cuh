// Block-wide reductions and row passes shared by the runtime's kernels
// (runtime_ops.cu, ds4_kernels.cu, kimi_kernels.cu): every thread of the block
// calls them and gets the result. blockDim.x must be a multiple of 32 (at most
// 1024). Sums are in double so a row's total does not depend on the launch
// shape beyond double rounding.
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

// A thread's loads over a row go out this many at a time. One at a time (the
// plain loop, each load waited for before the next) a 16384-value row was 64
// round trips to L2 per thread of a 256-thread block: deepseek4's hc_pre took
// 35 us of a decode step where its three launches before had taken 31 (H200,
// --profile-ops, 2026-12-03).
constexpr int kRowLoads = 8;

// The sum over row[0, width) of float(x * x), in double, across the block;
// each thread's kRowLoads partial sums are added in a fixed order.
__device__ inline double block_sum_squares(const float* row, int64_t width) {
  double part[kRowLoads] = {};
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kRowLoads - 1) * step < width; i += kRowLoads * step) {
    float v[kRowLoads];
#pragma unroll
    for (int k = 0; k < kRowLoads; ++k) v[k] = row[i + k * step];
#pragma unroll
    for (int k = 0; k < kRowLoads; ++k) part[k] += static_cast<double>(v[k] * v[k]);
  }
  for (; i < width; i += step) part[0] += static_cast<double>(row[i] * row[i]);
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kRowLoads; ++k) s += part[k];
  return block_sum(s);
}

// rms_norm's scale from a row's sum of squares over n values: the CPU backend's
// rms_scale (examples/xpack-run/cpu_backend.h), expression for expression.
__device__ inline float rms_scale_of(double sum_sq, int64_t n, float eps) {
  return 1.0f / sqrtf(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
}

// rms_scale_of a row of width values, its squares summed across the block;
// every thread of the block calls it and gets the scale.
__device__ inline float block_rms_scale(const float* row, int64_t width, float eps) {
  return rms_scale_of(block_sum_squares(row, width), width, eps);
}

// y[i] = (x[i] * scale) * w[i] (or x[i] * scale without w): rms_norm's last
// pass. y may be x: each thread writes only what it read, and all of a
// batch's loads go out before its stores. Loads bypass L1, which may hold
// nothing of other blocks' writes to x in the same launch.
__device__ inline void block_scale_row(const float* x, float scale, const float* w, int64_t width, float* y) {
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kRowLoads - 1) * step < width; i += kRowLoads * step) {
    float v[kRowLoads], g[kRowLoads];
#pragma unroll
    for (int k = 0; k < kRowLoads; ++k) {
      v[k] = __ldcg(x + i + k * step);
      g[k] = w ? w[i + k * step] : 1.0f;
    }
#pragma unroll
    for (int k = 0; k < kRowLoads; ++k) {
      const float u = v[k] * scale;
      y[i + k * step] = w ? u * g[k] : u;
    }
  }
  for (; i < width; i += step) {
    const float u = __ldcg(x + i) * scale;
    y[i] = w ? u * w[i] : u;
  }
}

}  // namespace xpack::rt
