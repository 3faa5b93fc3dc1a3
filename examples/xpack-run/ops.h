// Host math of the graphs not yet converted to the backend (backend.h).
//
// Layout convention (ggml's): a matrix W has ne0 = inputs (contiguous) and
// ne1 = outputs, so y = W x means y[o] = sum_i W[o*ne0 + i] * x[i].
// Activations are row-major [n_tokens][width].
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dequant.h"
#include "experts.h"
#include "weights.h"
#include "worker_pool.h"

namespace xrun {

// Transitional: the host-side helpers of the graphs not yet written against
// backend.h (deepseek4, kimi_k3). They compute exactly as the CPU backend.
// The CPU matrix product (cpu_matmul) on host arrays.
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


}  // namespace xrun

#include <cmath>
#include <functional>
inline float xrun::silu(float x) { return x / (1.0f + std::exp(-x)); }
