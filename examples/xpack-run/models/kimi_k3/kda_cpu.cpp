// KDA's short convolution, decay gate and gated delta rule on the CPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

namespace {

// ggml_softplus
float softplus_ggml(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

}  // namespace

void CpuKimiOps::short_conv_silu(const Tensor& x, const Tensor& weight, const Tensor& state) {
  const int64_t D = x.width(), n = x.rows(), d_conv = weight.width(), n_prev = d_conv - 1;
  check_shape(weight.rows() == D && state.width() == D && state.rows() == n_prev, "short_conv shapes disagree");
  std::vector<float> hist(static_cast<size_t>((n_prev + n) * D));
  std::copy_n(state.f32(), n_prev * D, hist.begin());
  std::copy_n(x.f32(), n * D, hist.begin() + n_prev * D);
  const float* w = weight.f32();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      float sum = 0.0f;
      for (int64_t j = 0; j < d_conv; ++j) sum += hist[(t + j) * D + c] * w[c * d_conv + j];
      x.f32()[t * D + c] = silu(sum);
    }
  }
  std::copy(hist.end() - n_prev * D, hist.end(), state.f32());
}

void CpuKimiOps::kda_gate(const Tensor& g, const Tensor& dt_bias, const Tensor& a, int64_t head_dim,
                          bool has_lower_bound, float lower_bound) {
  const int64_t D = g.width(), H = D / head_dim;
  check_shape(D % head_dim == 0 && dt_bias.numel() == D && a.numel() == H, "kda_gate shapes disagree");
  for (int64_t t = 0; t < g.rows(); ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < head_dim; ++i) {
        float& gi = g.f32()[t * D + h * head_dim + i];
        gi += dt_bias.f32()[h * head_dim + i];
        // ssm_a holds -exp(A_log) (folded at conversion), so exp(A_log) = -ssm_a.
        // The lower bound is not a clamp: it swaps the activation for a scaled sigmoid.
        if (has_lower_bound)
          gi = lower_bound * sigmoid(-(gi * a.f32()[h]));
        else
          gi = softplus_ggml(gi) * a.f32()[h];
      }
    }
  }
}

void CpuKimiOps::delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                            const Tensor& state, const Tensor& o) {
  const int64_t D = q.width(), H = beta.width(), hd = D / H, n = q.rows();
  check_shape(D % H == 0 && k.width() == D && v.width() == D && g.width() == D && o.width() == D &&
                  beta.rows() == n && state.numel() == H * hd * hd,
              "delta_rule shapes disagree");
  pool_.parallel_for(H, 0, [&](int64_t h0, int64_t h1) {
    std::vector<float> sk(static_cast<size_t>(hd)), d(static_cast<size_t>(hd));
    for (int64_t h = h0; h < h1; ++h) {
      float* S = state.f32() + h * hd * hd;  // S[i*hd + j]: key i, value j
      for (int64_t t = 0; t < n; ++t) {
        const float* gt = g.f32() + t * D + h * hd;
        const float* kt = k.f32() + t * D + h * hd;
        const float* vt = v.f32() + t * D + h * hd;
        const float* qt = q.f32() + t * D + h * hd;
        const float bt = beta.f32()[t * H + h];
        for (int64_t i = 0; i < hd; ++i) {
          const float decay = std::exp(gt[i]);
          for (int64_t j = 0; j < hd; ++j) S[i * hd + j] *= decay;
        }
        std::fill(sk.begin(), sk.end(), 0.0f);
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) sk[j] += S[i * hd + j] * kt[i];
        for (int64_t j = 0; j < hd; ++j) d[j] = (vt[j] - sk[j]) * bt;
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) S[i * hd + j] += kt[i] * d[j];
        float* ot = o.f32() + t * D + h * hd;
        std::fill(ot, ot + hd, 0.0f);
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) ot[j] += S[i * hd + j] * qt[i];
      }
    }
  });
}

}  // namespace xrun::kimi_k3
