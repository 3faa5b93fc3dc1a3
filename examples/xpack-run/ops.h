// CPU math used by the model graphs. The heavy operations (matrix products over
// quantized weights) go through ComputeBackend so a CUDA backend can replace the
// CPU one; the elementwise helpers are plain functions on float arrays.
//
// Layout convention (ggml's): a matrix W has ne0 = inputs (contiguous) and
// ne1 = outputs, so y = W x means y[o] = sum_i W[o*ne0 + i] * x[i].
// Activations are row-major [n_tokens][width].
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "experts.h"
#include "weights.h"

namespace xrun {

// Dequantizes n consecutive elements (n a multiple of the type's block size)
// of ggml type `type` starting at `src` (which must point at a block start).
// Supports F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, I32 (as float).
void dequantize(uint32_t type, const void* src, float* dst, int64_t n);

// Bytes of one row of ne0 elements of `type`.
size_t row_bytes(uint32_t type, int64_t ne0);

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  // y[t][o] = sum_i W[o][i] * x[t][i] for t < n_tokens, o < ne1, i < ne0.
  // x: [n_tokens][ne0], y: [n_tokens][ne1] (overwritten).
  virtual void matmul(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x,
                      int n_tokens, float* y) = 0;
  virtual const char* name() const = 0;
};

// The process-wide backend (CPU unless --device says otherwise).
ComputeBackend& backend();
void set_threads(int n);
int threads();

// Convenience wrappers over backend().matmul.
void matmul(const WeightTensor& w, const float* x, int n_tokens, float* y);
void matmul(const ExpertMatrix& w, const float* x, int n_tokens, float* y);

// Elementwise helpers.
void rms_norm(const float* x, const float* weight /* nullable */, int64_t n, float eps,
              float* y);
void softmax_inplace(float* x, int64_t n);
inline float silu(float x);
float sigmoid(float x);
float softplus(float x);

// A weight tensor as floats (dequantized), e.g. norms, biases, small tables.
std::vector<float> to_float(const WeightTensor& w);

// Parallel for over [0, n) in chunks using threads() workers.
void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace xrun

#include <cmath>
#include <functional>
inline float xrun::silu(float x) { return x / (1.0f + std::exp(-x)); }
