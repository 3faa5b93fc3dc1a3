// Kimi Delta Attention (KDA), the linear-attention layer of Kimi-K3, as
// llama.cpp's kimi-k3 graph computes it:
//
//   q, k, v = silu(causal_conv1d(W{q,k,v} x))         short convolutions, own state
//   g       = lower_bound * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias))   (K3)
//           = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)   (no lower bound: kimi-linear)
//   beta    = sigmoid(W_beta x)                                 one per head
//   q, k    = l2_norm(q), l2_norm(k);  q *= 1/sqrt(head_dim)
//   per head, per token (S is [key][value]):
//     S = diag(exp(g)) S;  S += k (beta (v - S^T k))^T;  o = S^T q
//   out     = W_o( rms_norm(o) * ssm_norm * sigmoid(W_g x) )
//
// llama.cpp evaluates a batch with the chunked form of the delta rule and a
// single token with the recurrent form; both are the same recurrence, which is
// what runs here for every token (so prefill and decode agree by construction).
#include <cmath>

#include "../../ops.h"
#include "kimi_k3.h"

namespace xrun::kimi_k3 {

namespace {

// ggml_l2_norm: x / max(||x||, eps), the sum of squares in double.
void l2_norm_inplace(float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::fmax(std::sqrt(static_cast<float>(sum)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// ggml_softplus
float softplus_ggml(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

}  // namespace

KdaLayer::KdaLayer(const Weights& w, const Hparams& hp, int il) : hp_(hp) {
  const int64_t E = hp.n_embd, D = hp.d_inner, H = hp.n_head, hd = hp.kda_head_dim;
  // conv1d is stored 4-D [d_conv, 1, d_inner, 1] or 3-D (quantizers drop the trailing 1)
  const char* conv_names[3] = {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"};
  for (int i = 0; i < 3; ++i)
    conv_w_[i] = to_float(w.get(layer_name(il, conv_names[i]), {hp.d_conv, 1, D}));
  wq_ = &w.get(layer_name(il, "attn_q.weight"), {E, D});
  wk_ = &w.get(layer_name(il, "attn_k.weight"), {E, D});
  wv_ = &w.get(layer_name(il, "attn_v.weight"), {E, D});
  f_a_ = &w.get(layer_name(il, "ssm_f_a.weight"), {E, hd});
  f_b_ = &w.get(layer_name(il, "ssm_f_b.weight"), {hd, D});
  beta_ = &w.get(layer_name(il, "ssm_beta.weight"), {E, H});
  a_ = to_float(w.get(layer_name(il, "ssm_a"), {H}));
  dt_bias_ = to_float(w.get(layer_name(il, "ssm_dt.bias"), {D}));
  g_ = &w.get(layer_name(il, "ssm_g.weight"), {E, D});
  o_norm_ = to_float(w.get(layer_name(il, "ssm_norm.weight"), {hd}));
  wo_ = &w.get(layer_name(il, "attn_output.weight"), {D, E});
}

void KdaLayer::init_state(KdaState& st) const {
  for (auto& c : st.conv) c.assign(static_cast<size_t>((hp_.d_conv - 1) * hp_.d_inner), 0.0f);
  st.s.assign(static_cast<size_t>(hp_.n_head * hp_.kda_head_dim * hp_.kda_head_dim), 0.0f);
}

namespace {

// Causal depthwise conv1d over time with the previous d_conv-1 inputs as state
// (ggml_ssm_conv), then silu. `x` [n][D] is replaced by the result; the state
// keeps the last d_conv-1 raw inputs.
void short_conv_silu(float* x, int n, int64_t D, int64_t d_conv, const std::vector<float>& w,
                     std::vector<float>& state) {
  const int64_t n_prev = d_conv - 1;
  std::vector<float> hist(static_cast<size_t>((n_prev + n) * D));
  std::copy(state.begin(), state.end(), hist.begin());
  std::copy(x, x + n * D, hist.begin() + n_prev * D);
  for (int t = 0; t < n; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      float sum = 0.0f;
      for (int64_t j = 0; j < d_conv; ++j) sum += hist[(t + j) * D + c] * w[c * d_conv + j];
      x[t * D + c] = silu(sum);
    }
  }
  std::copy(hist.end() - n_prev * D, hist.end(), state.begin());
}

}  // namespace

void KdaLayer::forward(const float* x, int n, KdaState& st, float* out) const {
  const int64_t D = hp_.d_inner, H = hp_.n_head, hd = hp_.kda_head_dim;
  const float eps = hp_.norm_eps;

  // --- q, k, v: projection, then a short causal convolution with its own state
  std::vector<float> qkv[3];
  const WeightTensor* proj[3] = {wq_, wk_, wv_};
  for (int i = 0; i < 3; ++i) {
    qkv[i].resize(static_cast<size_t>(n * D));
    matmul(*proj[i], x, n, qkv[i].data());
    short_conv_silu(qkv[i].data(), n, D, hp_.d_conv, conv_w_[i], st.conv[i]);
  }
  std::vector<float>&q = qkv[0], &k = qkv[1], &v = qkv[2];

  // --- per-channel decay (log space), from the low-rank forget gate
  std::vector<float> fa(static_cast<size_t>(n * f_a_->ne[1]));
  matmul(*f_a_, x, n, fa.data());
  std::vector<float> g(static_cast<size_t>(n * D));
  matmul(*f_b_, fa.data(), n, g.data());
  for (int t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < hd; ++i) {
        float& gi = g[t * D + h * hd + i];
        gi += dt_bias_[h * hd + i];
        // ssm_a holds -exp(A_log) (folded at conversion), so exp(A_log) = -ssm_a.
        // The lower bound is not a clamp: it swaps the activation for a scaled sigmoid.
        if (hp_.has_gate_lower_bound)
          gi = hp_.gate_lower_bound * sigmoid(-(gi * a_[h]));
        else
          gi = softplus_ggml(gi) * a_[h];
      }
    }
  }

  // --- write strength, one per head
  std::vector<float> beta(static_cast<size_t>(n * H));
  matmul(*beta_, x, n, beta.data());
  for (float& b : beta) b = sigmoid(b);

  // --- unit-length queries and keys; the 1/sqrt(d) scale goes on q
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float* qh = &q[t * D + h * hd];
      l2_norm_inplace(qh, hd, eps);
      for (int64_t i = 0; i < hd; ++i) qh[i] *= q_scale;
      l2_norm_inplace(&k[t * D + h * hd], hd, eps);
    }
  }

  // --- gated delta rule, token by token, one state matrix per head
  std::vector<float> o(static_cast<size_t>(n * D));
  parallel_for(H, [&](int64_t h0, int64_t h1) {
    std::vector<float> sk(static_cast<size_t>(hd)), d(static_cast<size_t>(hd));
    for (int64_t h = h0; h < h1; ++h) {
      float* S = &st.s[h * hd * hd];  // S[i*hd + j]: key i, value j
      for (int t = 0; t < n; ++t) {
        const float* gt = &g[t * D + h * hd];
        const float* kt = &k[t * D + h * hd];
        const float* vt = &v[t * D + h * hd];
        const float* qt = &q[t * D + h * hd];
        const float bt = beta[t * H + h];
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
        float* ot = &o[t * D + h * hd];
        std::fill(ot, ot + hd, 0.0f);
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) ot[j] += S[i * hd + j] * qt[i];
      }
    }
  });

  // --- per-head rms norm, full-rank sigmoid output gate, output projection
  std::vector<float> gate(static_cast<size_t>(n * D));
  matmul(*g_, x, n, gate.data());
  for (int t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float* oh = &o[t * D + h * hd];
      rms_norm_row(oh, o_norm_.data(), hd, eps, oh);
      for (int64_t i = 0; i < hd; ++i) oh[i] *= sigmoid(gate[t * D + h * hd + i]);
    }
  }
  matmul(*wo_, o.data(), n, out);
}

}  // namespace xrun::kimi_k3
