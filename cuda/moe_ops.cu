// The elementwise pieces of a routed-experts dispatcher: gather rows per expert,
// the FFN activations, and the weighted combine back per token. The combine sums
// each token's experts in its top-k order (no atomics), so the result does not
// depend on which experts were computed first.
#include <algorithm>

#include "quant_matmul.h"

namespace xpack::kernels {
namespace {

unsigned grid_for(int64_t n) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 132 * 16))); }

__global__ void gather_kernel(const float* __restrict__ src, int64_t ne0, const int32_t* __restrict__ rows,
                              int64_t n_rows, float* __restrict__ dst) {
  const int64_t n = n_rows * ne0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ne0, c = i - r * ne0;
    dst[i] = src[int64_t(rows[r]) * ne0 + c];
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// kind 0: silu*mul, 1: clamped SwiGLU, 2: situ.
__global__ void act_kernel(const float* gate, const float* up, int64_t n, int kind, float a, float b,
                           float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float g = gate[i], u = up[i];
    float r;
    if (kind == 0) {
      r = silu(g) * u;
    } else if (kind == 1) {
      if (a > 1e-6f) {
        g = fminf(g, a);
        u = fminf(fmaxf(u, -a), a);
      }
      r = silu(g) * u;
    } else {
      const float s = tanhf(g * (1.0f / a)) * a * sigmoid(g);
      const float t = b > 0.0f ? tanhf(u * (1.0f / b)) * b : u;
      r = s * t;
    }
    out[i] = r;
  }
}

__global__ void combine_kernel(const float* __restrict__ y, int64_t ne0, const int32_t* __restrict__ rows,
                               const float* __restrict__ weights, int64_t n_tokens, int k, bool accumulate,
                               float* __restrict__ out) {
  const int64_t n = n_tokens * ne0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / ne0, c = i - t * ne0;
    float s = accumulate ? out[i] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t r = rows[t * k + j];
      if (r >= 0) s = __fadd_rn(s, __fmul_rn(weights[t * k + j], y[int64_t(r) * ne0 + c]));
    }
    out[i] = s;
  }
}

int done() { return cudaGetLastError() == cudaSuccess ? kOk : kErrCuda; }

int activation(const float* gate, const float* up, int64_t n, int kind, float a, float b, float* out,
               cudaStream_t s) {
  if (!gate || !up || !out || n < 0) return kErrArgument;
  if (n == 0) return kOk;
  act_kernel<<<grid_for(n), 256, 0, s>>>(gate, up, n, kind, a, b, out);
  return done();
}

}  // namespace

int gather_rows(const float* src, int64_t ne0, const int32_t* rows, int64_t n_rows, float* dst,
                cudaStream_t stream) {
  if (!src || !rows || !dst || ne0 <= 0 || n_rows < 0) return kErrArgument;
  if (n_rows == 0) return kOk;
  gather_kernel<<<grid_for(n_rows * ne0), 256, 0, stream>>>(src, ne0, rows, n_rows, dst);
  return done();
}

int silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  return activation(gate, up, n, 0, 0.0f, 0.0f, out, stream);
}

int clamped_swiglu(const float* gate, const float* up, int64_t n, float limit, float* out,
                   cudaStream_t stream) {
  return activation(gate, up, n, 1, limit, 0.0f, out, stream);
}

int situ_mul(const float* gate, const float* up, int64_t n, float beta, float linear_beta, float* out,
             cudaStream_t stream) {
  if (!(beta > 0.0f)) return kErrArgument;
  return activation(gate, up, n, 2, beta, linear_beta, out, stream);
}

int combine_rows(const float* y, int64_t ne0, const int32_t* rows, const float* weights, int64_t n_tokens,
                 int k, bool accumulate, float* out, cudaStream_t stream) {
  if (!y || !rows || !weights || !out || ne0 <= 0 || n_tokens < 0 || k <= 0) return kErrArgument;
  if (n_tokens == 0) return kOk;
  combine_kernel<<<grid_for(n_tokens * ne0), 256, 0, stream>>>(y, ne0, rows, weights, n_tokens, k, accumulate, out);
  return done();
}

}  // namespace xpack::kernels
