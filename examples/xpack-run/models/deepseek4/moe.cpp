// Routed + shared experts (see moe.h).
#include "moe.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <functional>  // ops.h uses std::function before including it

#include "../../ops.h"
#include "xpack/xpack.h"

namespace xrun::ds4 {

void clamped_swiglu(float* gate, const float* up, int64_t n, float limit) {
  const bool clamp = limit > 1e-6f;
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i], u = up[i];
    if (clamp) {
      g = std::min(g, limit);
      u = std::min(std::max(u, -limit), limit);
    }
    gate[i] = silu(g) * u;
  }
}

MoeBlock::MoeBlock(const Weights& w, const Hparams& hp, int64_t layer, ExpertSource* experts)
    : hp_(hp), layer_(layer), experts_(experts) {
  const int64_t d = hp.n_embd;
  gate_inp_ = &w.get(blk(layer, "ffn_gate_inp.weight"), {d, hp.n_expert});
  if (layer < hp.n_hash_layers) {
    tid2eid_ = &w.get(blk(layer, "ffn_gate_tid2eid.weight"), {hp.n_expert_used, hp.n_vocab});
    if (tid2eid_->type != XPACK_TYPE_I32) {
      throw ModelError("tensor " + tid2eid_->name + " must be I32 (expert ids)");
    }
  } else {
    probs_bias_ = to_float(w.get(blk(layer, "exp_probs_b.bias"), {hp.n_expert}));
  }
  gate_sh_ = &w.get(blk(layer, "ffn_gate_shexp.weight"), {d, hp.n_ff_shexp});
  up_sh_ = &w.get(blk(layer, "ffn_up_shexp.weight"), {d, hp.n_ff_shexp});
  down_sh_ = &w.get(blk(layer, "ffn_down_shexp.weight"), {hp.n_ff_shexp, d});
  clamp_exp_ = hp.swiglu_clamp_exp[static_cast<size_t>(layer)];
  clamp_shexp_ = hp.swiglu_clamp_shexp[static_cast<size_t>(layer)];
  if (!experts_ || !experts_->has_layer(static_cast<int>(layer))) {
    throw ModelError("missing routed experts of layer " + std::to_string(layer) + " (ffn_{gate,up,down}_exps)");
  }
  if (experts_->n_experts() != hp.n_expert) {
    throw ModelError("expert source has " + std::to_string(experts_->n_experts()) + " experts, expected expert_count " +
                     std::to_string(hp.n_expert));
  }
}

MoeBlock::Route MoeBlock::route(const float* x, const int32_t* tokens, int n) const {
  const int64_t ne = hp_.n_expert, k = hp_.n_expert_used;
  std::vector<float> scores(static_cast<size_t>(n * ne));
  matmul(*gate_inp_, x, n, scores.data());
  for (float& s : scores) s = std::sqrt(softplus(s));

  Route r;
  r.ids.resize(static_cast<size_t>(n * k));
  r.weights.resize(static_cast<size_t>(n * k));
  std::vector<int32_t> order(static_cast<size_t>(ne));
  std::vector<float> biased(static_cast<size_t>(ne));
  for (int t = 0; t < n; ++t) {
    const float* s = scores.data() + t * ne;
    int32_t* ids = r.ids.data() + t * k;
    if (tid2eid_) {
      // Hash routing: the experts are a fixed function of the token id.
      const auto* table = static_cast<const int32_t*>(tid2eid_->data) + static_cast<int64_t>(tokens[t]) * k;
      for (int64_t j = 0; j < k; ++j) {
        if (table[j] < 0 || table[j] >= ne) {
          throw ModelError("tensor " + tid2eid_->name + " maps token " + std::to_string(tokens[t]) +
                           " to expert " + std::to_string(table[j]) + ", outside [0, " + std::to_string(ne) + ")");
        }
        ids[j] = table[j];
      }
    } else {
      // Learned routing: top-k of score + selection bias, best first.
      for (int64_t e = 0; e < ne; ++e) biased[e] = s[e] + probs_bias_[e];
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
      });
      std::copy_n(order.begin(), k, ids);
    }
    // Weights use the unbiased scores of the chosen experts.
    float* wt = r.weights.data() + t * k;
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      wt[j] = s[ids[j]];
      sum += wt[j];
    }
    if (hp_.expert_weights_norm) {
      // A floor on the sum keeps an all-zero score row finite (llama.cpp's fp16 min normal).
      const float denom = std::max(static_cast<float>(sum), 6.103515625e-5f);
      for (int64_t j = 0; j < k; ++j) wt[j] /= denom;
    }
    if (hp_.expert_weights_scale != 0.0f && hp_.expert_weights_scale != 1.0f) {
      for (int64_t j = 0; j < k; ++j) wt[j] *= hp_.expert_weights_scale;
    }
  }
  return r;
}

namespace {

// The gate/up/down matrices of one delivered expert, checked against the model.
struct ExpertFfn {
  ExpertMatrix gate, up, down;
};

ExpertFfn expert_ffn(const ExpertWeights& ew, const Hparams& hp, int64_t layer) {
  ExpertFfn f;
  const std::string where = "layer " + std::to_string(layer) + " expert " + std::to_string(ew.expert);
  if (const ExpertMatrix* gu = ew.role("gate_up")) {
    // Fused form: the first n_ff outputs are the gate, the next n_ff the up projection.
    if (gu->ne1 != 2 * hp.n_ff_exp) throw ModelError(where + ": gate_up has the wrong shape");
    const size_t half = static_cast<size_t>(hp.n_ff_exp) * row_bytes(gu->type, gu->ne0);
    f.gate = *gu;
    f.gate.ne1 = hp.n_ff_exp;
    f.gate.nbytes = half;
    f.up = f.gate;
    f.up.data = static_cast<const uint8_t*>(gu->data) + half;
  } else {
    const ExpertMatrix* g = ew.role("gate");
    const ExpertMatrix* u = ew.role("up");
    if (!g || !u) throw ModelError(where + ": missing gate/up weights");
    f.gate = *g;
    f.up = *u;
  }
  const ExpertMatrix* dn = ew.role("down");
  if (!dn) throw ModelError(where + ": missing down weights");
  f.down = *dn;
  if (f.gate.ne0 != hp.n_embd || f.gate.ne1 != hp.n_ff_exp || f.up.ne0 != hp.n_embd ||
      f.up.ne1 != hp.n_ff_exp || f.down.ne0 != hp.n_ff_exp || f.down.ne1 != hp.n_embd) {
    throw ModelError(where + ": weight shapes do not match embedding_length/expert_feed_forward_length");
  }
  return f;
}

}  // namespace

void MoeBlock::forward(const float* x, const int32_t* tokens, int n, float* out) {
  const int64_t d = hp_.n_embd, k = hp_.n_expert_used, ff = hp_.n_ff_exp;
  const Route r = route(x, tokens, n);

  // Group the (token, slot) pairs by expert.
  std::map<int32_t, std::vector<int64_t>> pairs_of;  // expert -> t*k + slot
  for (int64_t i = 0; i < n * k; ++i) pairs_of[r.ids[i]].push_back(i);
  std::vector<int32_t> ids;
  for (const auto& [e, pairs] : pairs_of) ids.push_back(e);

  std::vector<float> per_slot(static_cast<size_t>(n * k * d));
  {
    std::vector<float> xs, g, u, y;
    experts_->for_each(static_cast<int>(layer_), ids.data(), static_cast<int>(ids.size()), [&](const ExpertWeights& ew) {
      auto it = pairs_of.find(ew.expert);
      if (it == pairs_of.end()) return;
      const std::vector<int64_t>& pairs = it->second;
      const ExpertFfn f = expert_ffn(ew, hp_, layer_);
      const int m = static_cast<int>(pairs.size());
      xs.resize(static_cast<size_t>(m * d));
      for (int j = 0; j < m; ++j) std::copy_n(x + pairs[j] / k * d, d, xs.data() + j * d);
      g.resize(static_cast<size_t>(m * ff));
      u.resize(static_cast<size_t>(m * ff));
      y.resize(static_cast<size_t>(m * d));
      matmul(f.gate, xs.data(), m, g.data());
      matmul(f.up, xs.data(), m, u.data());
      clamped_swiglu(g.data(), u.data(), m * ff, clamp_exp_);
      matmul(f.down, g.data(), m, y.data());
      for (int j = 0; j < m; ++j) {
        const float wj = r.weights[pairs[j]];
        float* dst = per_slot.data() + pairs[j] * d;
        for (int64_t i = 0; i < d; ++i) dst[i] = y[j * d + i] * wj;
      }
      pairs_of.erase(it);
    });
    if (!pairs_of.empty()) {
      throw ModelError("expert source did not deliver expert " + std::to_string(pairs_of.begin()->first) +
                       " of layer " + std::to_string(layer_));
    }
  }

  shared_expert(x, n, out);
  // Sum in slot order (as llama.cpp adds its expert views), then the shared expert.
  std::vector<float> acc(static_cast<size_t>(d));
  for (int t = 0; t < n; ++t) {
    const float* slots = per_slot.data() + t * k * d;
    std::copy_n(slots, d, acc.data());
    for (int64_t j = 1; j < k; ++j) {
      for (int64_t i = 0; i < d; ++i) acc[i] += slots[j * d + i];
    }
    float* o = out + t * d;
    for (int64_t i = 0; i < d; ++i) o[i] = acc[i] + o[i];
  }
}

void MoeBlock::shared_expert(const float* x, int n, float* out) const {
  const int64_t ff = hp_.n_ff_shexp;
  std::vector<float> g(static_cast<size_t>(n * ff)), u(static_cast<size_t>(n * ff));
  matmul(*gate_sh_, x, n, g.data());
  matmul(*up_sh_, x, n, u.data());
  clamped_swiglu(g.data(), u.data(), n * ff, clamp_shexp_);
  matmul(*down_sh_, g.data(), n, out);
}

}  // namespace xrun::ds4
