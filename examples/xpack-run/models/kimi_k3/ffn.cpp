// Kimi-K3 feed-forward blocks, as llama.cpp's kimi-k3 graph computes them:
//
//   situ(g, u)  = beta*tanh(g/beta)*sigmoid(g) * linear_beta*tanh(u/linear_beta)
//                 (replaces SwiGLU everywhere; linear_beta <= 0 leaves u untouched)
//   dense FFN   = W_down situ(W_gate x, W_up x)         leading_dense_block_count layers
//   latent MoE  = the other layers:
//     router    : p = gate(W_router x) on the FULL-width x; pick the top-k of p + bias;
//                 weights = p of the picked experts, renormalized, times weights_scale
//     routed    : z = W_routed_down x;  y = sum_k w_k expert_k(z)   (experts in the latent width)
//                 y = W_routed_up(rms_norm(y) * routed_norm)
//     shared    : + W_down_sh situ(W_gate_sh x, W_up_sh x)         (full width)
//
// Every selected expert is computed. A batch is grouped by expert: each distinct
// expert of the layer is acquired once and runs over all of its tokens as one
// matrix product; the weighted results are added back per token in top-k order.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "../../ops.h"
#include "kimi_k3.h"

namespace xrun::kimi_k3 {

float situ(float g, float u, float beta, float linear_beta) {
  const float a = std::tanh(g * (1.0f / beta)) * beta * sigmoid(g);
  const float b = linear_beta > 0.0f ? std::tanh(u * (1.0f / linear_beta)) * linear_beta : u;
  return a * b;
}

namespace {

// gate/up/down through situ for n rows: x [n][ne0 of gate], out [n][ne1 of down].
void situ_ffn(const Hparams& hp, const WeightTensor& gate, const WeightTensor& up,
              const WeightTensor& down, const float* x, int n, float* out) {
  const int64_t ff = gate.ne[1];
  std::vector<float> g(static_cast<size_t>(n * ff)), u(static_cast<size_t>(n * ff));
  matmul(gate, x, n, g.data());
  matmul(up, x, n, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = situ(g[i], u[i], hp.situ_beta, hp.situ_linear_beta);
  matmul(down, g.data(), n, out);
}

}  // namespace

DenseFfn::DenseFfn(const Weights& w, const Hparams& hp, int il) : hp_(hp) {
  const int64_t E = hp.n_embd, F = hp.n_ff[il];
  gate_ = &w.get(layer_name(il, "ffn_gate.weight"), {E, F});
  up_ = &w.get(layer_name(il, "ffn_up.weight"), {E, F});
  down_ = &w.get(layer_name(il, "ffn_down.weight"), {F, E});
}

void DenseFfn::forward(const float* x, int n, float* out) const {
  situ_ffn(hp_, *gate_, *up_, *down_, x, n, out);
}

LatentMoe::LatentMoe(const Weights& w, const Hparams& hp, int il, ExpertSource* experts)
    : hp_(hp), il_(il), experts_(experts) {
  const int64_t E = hp.n_embd, L = hp.n_latent;
  if (!experts_ || !experts_->has_layer(il))
    throw ModelError("kimi-k3: no routed experts for MoE layer " + std::to_string(il) + " (" +
                     layer_name(il, "ffn_gate_exps.weight") + ")");
  if (experts_->n_experts() != hp.n_expert)
    throw ModelError("kimi-k3: expert source has " + std::to_string(experts_->n_experts()) +
                     " experts, expert_count is " + std::to_string(hp.n_expert));
  gate_inp_ = &w.get(layer_name(il, "ffn_gate_inp.weight"), {E, hp.n_expert});
  if (const WeightTensor* b = w.find(layer_name(il, "exp_probs_b.bias")))
    probs_b_ = to_float(w.get(b->name, {hp.n_expert}));
  if (hp.has_latent) {
    routed_down_ = &w.get(layer_name(il, "ffn_routed_down.weight"), {E, L});
    routed_up_ = &w.get(layer_name(il, "ffn_routed_up.weight"), {L, E});
    if (const WeightTensor* rn = w.find(layer_name(il, "ffn_routed_norm.weight")))
      routed_norm_ = to_float(w.get(rn->name, {L}));
  }
  // shared experts: full width, n_ff_exp * expert_shared_count wide
  if (w.find(layer_name(il, "ffn_gate_shexp.weight"))) {
    const int64_t F = hp.n_ff_exp * std::max<int64_t>(hp.n_expert_shared, 1);
    gate_sh_ = &w.get(layer_name(il, "ffn_gate_shexp.weight"), {E, F});
    up_sh_ = &w.get(layer_name(il, "ffn_up_shexp.weight"), {E, F});
    down_sh_ = &w.get(layer_name(il, "ffn_down_shexp.weight"), {F, E});
  }
}

// Router: ids/weights [n][n_expert_used], ids in top-k order.
void LatentMoe::route(const float* x, int n, std::vector<int32_t>& ids, std::vector<float>& weights) const {
  const int64_t NE = hp_.n_expert, K = hp_.n_expert_used;
  std::vector<float> logits(static_cast<size_t>(n * NE));
  matmul(*gate_inp_, x, n, logits.data());
  ids.resize(static_cast<size_t>(n * K));
  weights.resize(static_cast<size_t>(n * K));
  std::vector<float> probs(static_cast<size_t>(NE)), sel(static_cast<size_t>(NE));
  std::vector<int32_t> order(static_cast<size_t>(NE));
  for (int t = 0; t < n; ++t) {
    std::copy(&logits[t * NE], &logits[(t + 1) * NE], probs.begin());
    switch (hp_.gating) {
      case Gating::softmax: softmax_row(probs.data(), NE); break;
      case Gating::sigmoid:
        for (float& p : probs) p = sigmoid(p);
        break;
      case Gating::softmax_weight: break;
      case Gating::sqrt_softplus:
        for (float& p : probs) p = std::sqrt(p > 20.0f ? p : std::log(1.0f + std::exp(p)));  // ggml_softplus
        break;
    }
    // the bias only steers the selection; the weights use the unbiased probabilities
    for (int64_t e = 0; e < NE; ++e) sel[e] = probs[e] + (probs_b_.empty() ? 0.0f : probs_b_[e]);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sel[a] > sel[b]; });
    float* wt = &weights[t * K];
    for (int64_t k = 0; k < K; ++k) {
      ids[t * K + k] = order[k];
      wt[k] = probs[order[k]];
    }
    if (hp_.gating == Gating::softmax_weight) softmax_row(wt, K);
    if (hp_.weights_norm) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += wt[k];
      sum = std::max(sum, 6.103515625e-5f);  // ggml clamps to the smallest f16 normal
      for (int64_t k = 0; k < K; ++k) wt[k] /= sum;
    }
    if (hp_.weights_scale != 0.0f && hp_.weights_scale != 1.0f)
      for (int64_t k = 0; k < K; ++k) wt[k] *= hp_.weights_scale;
  }
}

// The routed experts in the latent width, grouped by expert.
void LatentMoe::routed_experts(const float* z, int n, const std::vector<int32_t>& ids,
                               const std::vector<float>& weights, float* y) const {
  const int64_t K = hp_.n_expert_used, L = hp_.n_latent, F = hp_.n_ff_exp;

  // (token, slot) pairs per expert; experts in ascending id order
  std::map<int32_t, std::vector<int64_t>> pairs;  // expert -> t*K + slot
  for (int64_t i = 0; i < n * K; ++i) pairs[ids[i]].push_back(i);
  std::vector<int32_t> distinct;
  for (const auto& [e, _] : pairs) distinct.push_back(e);

  // weighted output of every (token, slot), summed per token in slot order below
  std::vector<float> slot_out(static_cast<size_t>(n * K * L));
  experts_->for_each(il_, distinct.data(), static_cast<int>(distinct.size()), [&](const ExpertWeights& ew) {
    const auto it = pairs.find(ew.expert);
    if (it == pairs.end()) return;
    const std::string who = "kimi-k3: layer " + std::to_string(il_) + " expert " + std::to_string(ew.expert);
    const ExpertMatrix* gate = ew.role("gate");
    const ExpertMatrix* up = ew.role("up");
    const ExpertMatrix* gate_up = ew.role("gate_up");
    const ExpertMatrix* down = ew.role("down");
    if (!down || !((gate && up) || gate_up)) throw ModelError(who + ": missing gate/up/down weights");
    if ((gate_up ? (gate_up->ne0 != L || gate_up->ne1 != 2 * F)
                 : (gate->ne0 != L || gate->ne1 != F || up->ne0 != L || up->ne1 != F)) ||
        down->ne0 != F || down->ne1 != L)
      throw ModelError(who + ": expert matrices do not match latent width " + std::to_string(L) +
                       " x expert_feed_forward_length " + std::to_string(F));

    const std::vector<int64_t>& rows = it->second;
    const int m = static_cast<int>(rows.size());
    std::vector<float> in(static_cast<size_t>(m * L));
    for (int r = 0; r < m; ++r) std::copy(&z[(rows[r] / K) * L], &z[(rows[r] / K + 1) * L], &in[r * L]);

    std::vector<float> g(static_cast<size_t>(m * F)), u(static_cast<size_t>(m * F));
    if (gate_up) {
      std::vector<float> gu(static_cast<size_t>(m * 2 * F));
      matmul(*gate_up, in.data(), m, gu.data());
      for (int r = 0; r < m; ++r) {
        std::copy(&gu[r * 2 * F], &gu[r * 2 * F + F], &g[r * F]);
        std::copy(&gu[r * 2 * F + F], &gu[(r + 1) * 2 * F], &u[r * F]);
      }
    } else {
      matmul(*gate, in.data(), m, g.data());
      matmul(*up, in.data(), m, u.data());
    }
    for (size_t i = 0; i < g.size(); ++i) g[i] = situ(g[i], u[i], hp_.situ_beta, hp_.situ_linear_beta);
    std::vector<float> out(static_cast<size_t>(m * L));
    matmul(*down, g.data(), m, out.data());
    for (int r = 0; r < m; ++r) {
      const float wgt = weights[rows[r]];
      float* dst = &slot_out[rows[r] * L];
      for (int64_t c = 0; c < L; ++c) dst[c] = out[r * L + c] * wgt;
    }
    pairs.erase(it);
  });
  if (!pairs.empty())
    throw ModelError("kimi-k3: expert source did not deliver expert " + std::to_string(pairs.begin()->first) +
                     " of layer " + std::to_string(il_));

  for (int t = 0; t < n; ++t) {
    float* yt = &y[t * L];
    std::copy(&slot_out[t * K * L], &slot_out[t * K * L + L], yt);
    for (int64_t k = 1; k < K; ++k)
      for (int64_t c = 0; c < L; ++c) yt[c] += slot_out[(t * K + k) * L + c];
  }
}

void LatentMoe::forward(const float* x, int n, float* out) const {
  const int64_t E = hp_.n_embd, L = hp_.n_latent;

  std::vector<int32_t> ids;
  std::vector<float> weights;
  route(x, n, ids, weights);

  std::vector<float> z;
  const float* latent_in = x;
  if (routed_down_) {
    z.resize(static_cast<size_t>(n * L));
    matmul(*routed_down_, x, n, z.data());
    latent_in = z.data();
  }
  std::vector<float> y(static_cast<size_t>(n * L));
  routed_experts(latent_in, n, ids, weights, y.data());

  if (!routed_norm_.empty())
    for (int t = 0; t < n; ++t) rms_norm_row(&y[t * L], routed_norm_.data(), L, hp_.norm_eps, &y[t * L]);
  if (routed_up_)
    matmul(*routed_up_, y.data(), n, out);
  else
    std::copy(y.begin(), y.end(), out);

  if (gate_sh_) {
    std::vector<float> sh(static_cast<size_t>(n * E));
    situ_ffn(hp_, *gate_sh_, *up_sh_, *down_sh_, x, n, sh.data());
    for (size_t i = 0; i < sh.size(); ++i) out[i] += sh[i];
  }
}

}  // namespace xrun::kimi_k3
