// Host math of the graphs not yet on the backend (see ops.h).
#include "ops.h"

#include <algorithm>
#include <cmath>

#include "cpu_backend.h"

namespace xrun {

// --- backend -------------------------------------------------------------------

void matmul(const WeightTensor& w, const float* x, int n_tokens, float* y) {
  cpu_matmul(w.type, w.data, w.ne[0], w.rows(), x, n_tokens, y);
}

void matmul(const ExpertMatrix& w, const float* x, int n_tokens, float* y) {
  cpu_matmul(w.type, w.data, w.ne0, w.ne1, x, n_tokens, y);
}

// --- elementwise -----------------------------------------------------------------

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y) {
  // Float squares summed in double, then one float scale: ggml's order.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * scale;
    y[i] = weight ? v * weight[i] : v;
  }
}

void softmax_inplace(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float softplus(float x) {
  // log(1 + e^x) without overflow for large x.
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

std::vector<float> to_float(const WeightTensor& w) {
  int64_t n = w.ne[0] * w.ne[1] * w.ne[2] * w.ne[3];
  std::vector<float> out(static_cast<size_t>(n));
  const size_t rb = row_bytes(w.type, w.ne[0]);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows(); ++r) {
    dequantize(w.type, src + static_cast<size_t>(r) * rb, out.data() + r * w.ne[0], w.ne[0]);
  }
  return out;
}

}  // namespace xrun
