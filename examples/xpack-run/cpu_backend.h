// The CPU backend: tensors in host memory (trunk weights are views of the
// mapped GGUF), operations run on the calling thread plus the worker pool and
// have finished when they return. Each output element is produced by one
// thread in a fixed order, so results depend neither on the thread count nor
// on where the weights came from (pack, cache, plain GGUF).
#pragma once

#include <cmath>

#include "backend.h"
#include "worker_pool.h"

namespace xrun {

class CpuBackend final : public Backend {
 public:
  // n_threads <= 0: all cores (default_threads()).
  explicit CpuBackend(int n_threads = 0) : pool_(n_threads) {}
  const char* name() const override { return "cpu"; }
  int threads() const { return pool_.size(); }
  // The threads every CPU operation runs on (also the model-specific ones).
  WorkerPool& pool() { return pool_; }

  Tensor alloc(uint32_t type, int64_t width, int64_t rows) override;
  Tensor weight(const WeightTensor& w) override;
  Tensor upload(uint32_t type, const void* host, int64_t width, int64_t rows) override;
  void download(const Tensor& src, void* host) override;
  void copy(const Tensor& src, const Tensor& dst) override;

  void* stream() override { return nullptr; }
  void wait_event(void* event) override;

  void matmul(const Tensor& w, const Tensor& x, const Tensor& y) override;
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void set_rows(const Tensor& src, const Tensor& ids, const Tensor& dst) override;
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void l2_norm(const Tensor& x, float eps, const Tensor& y) override;
  void scale(const Tensor& x, float s, const Tensor& out) override;
  void unary(Unary f, const Tensor& x, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor* weight, float eps, const Tensor& y) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void rope(const Tensor& x, const RopeSpec& spec, int64_t pos0, int64_t pos_step, bool inverse) override;
  void swiglu(const Tensor& gate, const Tensor& up, float limit, const Tensor& out) override;
  void softmax_rows(const Tensor& x) override;
  void top_k(const Tensor& scores, const Tensor& ids) override;
  void take(const Tensor& values, const Tensor& ids, const Tensor& out) override;
  void normalize_rows(const Tensor& x, float floor) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_head_kv,
                 int64_t pos0, float scale, const Tensor& out) override;
  void combine_picks(const Tensor& ys, const Tensor& rows, const Tensor& weights, int64_t k, bool accumulate,
                     const Tensor& out) override;

 private:
  WorkerPool pool_;
};

// Dot product of two float vectors, summed in a fixed order.
float dot_f32(const float* a, const float* b, int64_t n);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// The scale rms_norm applies to n values: 1 / sqrt(mean(x^2) + eps), the
// squares summed in double (ggml's order).
float rms_scale(const float* x, int64_t n, float eps);
// One row of rms_norm: y = x * rms_scale(x), times w where given (y may be x).
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y);

// In place: exp(x - max) / sum over n values (sum in double), ggml's softmax.
void softmax_row(float* x, int64_t n);

// Throws ModelError("backend: WHAT") unless ok: the ops' shape checks.
void check_shape(bool ok, const char* what);

}  // namespace xrun
