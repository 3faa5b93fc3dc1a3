// The absorbed MLA attention core of kimi-k3 on the CPU.
#include <algorithm>
#include <vector>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

namespace {

// y[t][o] = sum_i W[o][i] x[t][i] for a small float matrix, in plain order:
// it runs inside the per-head workers.
void matmul_f32(const float* W, int64_t ne0, int64_t ne1, const float* x, int64_t n, float* y) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < ne1; ++o) {
      float s = 0.0f;
      for (int64_t i = 0; i < ne0; ++i) s += W[o * ne0 + i] * x[t * ne0 + i];
      y[t * ne1 + o] = s;
    }
}

}  // namespace

void CpuKimiOps::mla_attention(const Tensor& q, const Tensor& latent, const Tensor& rope_key, const Tensor& k_b,
                               const Tensor& v_b, int64_t n_head, int64_t pos0, float scale, const Tensor& o) {
  const int64_t H = n_head, n = q.rows(), kv = latent.width(), rope = rope_key.width(), nope = k_b.width();
  const int64_t hk = nope + rope, hv = o.width() / H;
  check_shape(q.width() == H * hk && k_b.rows() == H * kv && v_b.width() == kv && v_b.rows() == H * hv &&
                  latent.rows() == rope_key.rows() && latent.rows() >= pos0 + n && o.rows() == n,
              "mla_attention shapes disagree");
  const float* Q = q.f32();
  pool_.parallel_for(H, 0, [&](int64_t h0, int64_t h1) {
    std::vector<float> q_nope(static_cast<size_t>(n * nope)), q_abs(static_cast<size_t>(n * kv));
    std::vector<float> lat(static_cast<size_t>(n * kv)), oh(static_cast<size_t>(n * hv));
    std::vector<float> scores(static_cast<size_t>(pos0 + n));
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t t = 0; t < n; ++t) std::copy_n(Q + (t * H + h) * hk, nope, &q_nope[t * nope]);
      matmul_f32(k_b.f32() + h * kv * nope, nope, kv, q_nope.data(), n, q_abs.data());
      for (int64_t t = 0; t < n; ++t) {
        const float* qa = &q_abs[t * kv];
        const float* qr = Q + (t * H + h) * hk + nope;
        const int64_t n_keys = pos0 + t + 1;  // causal
        for (int64_t p = 0; p < n_keys; ++p) {
          // One dot over [latent | rope key], continuing one sum.
          const float* c = latent.f32() + p * kv;
          const float* kr = rope_key.f32() + p * rope;
          float s = 0.0f;
          for (int64_t i = 0; i < kv; ++i) s += qa[i] * c[i];
          for (int64_t i = 0; i < rope; ++i) s += qr[i] * kr[i];
          scores[p] = s * scale;
        }
        softmax_row(scores.data(), n_keys);
        float* lt = &lat[t * kv];
        std::fill(lt, lt + kv, 0.0f);
        for (int64_t p = 0; p < n_keys; ++p) {
          const float* val = latent.f32() + p * kv;
          for (int64_t c = 0; c < kv; ++c) lt[c] += scores[p] * val[c];
        }
      }
      matmul_f32(v_b.f32() + h * hv * kv, kv, hv, lat.data(), n, oh.data());
      for (int64_t t = 0; t < n; ++t) std::copy_n(&oh[t * hv], hv, o.f32() + (t * H + h) * hv);
    }
  });
}

}  // namespace xrun::kimi_k3
