// Routed + shared experts (see moe.h).
#include "moe.h"

#include <vector>

#include "xpack/xpack.h"

namespace xrun::ds4 {

namespace {

// Hash routing reads expert ids straight from the table: every entry must be an expert.
void check_tid2eid(const WeightTensor& t, int64_t n_expert) {
  const auto* ids = static_cast<const int32_t*>(t.data);
  for (int64_t i = 0; i < t.ne[0] * t.rows(); ++i) {
    if (ids[i] < 0 || ids[i] >= n_expert) {
      throw ModelError("tensor " + t.name + " maps token " + std::to_string(i / t.ne[0]) + " to expert " +
                       std::to_string(ids[i]) + ", outside [0, " + std::to_string(n_expert) + ")");
    }
  }
}

}  // namespace

MoeBlock::MoeBlock(const Weights& w, const Hparams& hp, Backend& be, int64_t layer, ExpertSource* experts)
    : hp_(hp), be_(be), layer_(layer), experts_(experts) {
  const int64_t d = hp.n_embd;
  gate_inp_ = be.weight(w.get(blk(layer, "ffn_gate_inp.weight"), {d, hp.n_expert}));
  if (layer < hp.n_hash_layers) {
    const WeightTensor& t = w.get(blk(layer, "ffn_gate_tid2eid.weight"), {hp.n_expert_used, hp.n_vocab});
    if (t.type != XPACK_TYPE_I32) throw ModelError("tensor " + t.name + " must be I32 (expert ids)");
    check_tid2eid(t, hp.n_expert);
    tid2eid_ = be.weight(t);
    tid2eid_host_ = static_cast<const int32_t*>(t.data);
    hash_routed_ = true;
  } else {
    probs_bias_ = float_weight(be, w.get(blk(layer, "exp_probs_b.bias"), {hp.n_expert}));
  }
  shared_.gate = be.weight(w.get(blk(layer, "ffn_gate_shexp.weight"), {d, hp.n_ff_shexp}));
  shared_.up = be.weight(w.get(blk(layer, "ffn_up_shexp.weight"), {d, hp.n_ff_shexp}));
  shared_.down = be.weight(w.get(blk(layer, "ffn_down_shexp.weight"), {hp.n_ff_shexp, d}));
  // silu(min(gate, L)) * clamp(up, -L, L); L <= 1e-6 means plain SwiGLU.
  const float clamp_exp = hp.swiglu_clamp_exp[static_cast<size_t>(layer)];
  const float clamp_shexp = hp.swiglu_clamp_shexp[static_cast<size_t>(layer)];
  swiglu_exp_ = [this, clamp_exp](const Tensor& g, const Tensor& u) { be_.swiglu(g, u, clamp_exp, g); };
  swiglu_shexp_ = [this, clamp_shexp](const Tensor& g, const Tensor& u) { be_.swiglu(g, u, clamp_shexp, g); };
  if (!experts_ || !experts_->has_layer(static_cast<int>(layer))) {
    throw ModelError("missing routed experts of layer " + std::to_string(layer) + " (ffn_{gate,up,down}_exps)");
  }
  if (experts_->n_experts() != hp.n_expert) {
    throw ModelError("expert source has " + std::to_string(experts_->n_experts()) + " experts, expected expert_count " +
                     std::to_string(hp.n_expert));
  }
}

Routing MoeBlock::route(const Tensor& x, const Tensor& tokens, const int32_t* host_tokens, int64_t guess_width) const {
  const int64_t n = x.rows(), k = hp_.n_expert_used;
  const Tensor scores = be_.empty(XPACK_TYPE_F32, hp_.n_expert, n);
  be_.matmul(gate_inp_, x, scores);
  Routing r = make_routing(be_, n, k, guess_width);
  // Hash routing: the experts are a fixed function of the token id, on the
  // device (route() weighs them there) and, from the same table, on the host.
  if (hash_routed_) {
    be_.get_rows(tid2eid_, tokens, r.ids);
    if (host_tokens) {
      r.host_ids.resize(static_cast<size_t>(n * k));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < k; ++j) r.host_ids[size_t(t * k + j)] = tid2eid_host_[host_tokens[t] * k + j];
    }
  }
  // Scores sqrt(softplus); learned routing picks the top k of score + selection
  // bias, best first. The weights are the unbiased scores of the chosen
  // experts, normalised (the floor on the sum keeps an all-zero row finite:
  // llama.cpp's fp16 min normal) and scaled.
  Backend::RouteSpec spec;
  spec.gate = Unary::sqrt_softplus;
  spec.select = !hash_routed_;
  spec.bias = hash_routed_ ? nullptr : &probs_bias_;
  spec.normalize = hp_.expert_weights_norm;
  spec.floor = 6.103515625e-5f;
  spec.scale = hp_.expert_weights_scale;
  be_.route(scores, spec, r.ids, r.weights);
  return r;
}

void MoeBlock::prefetch_hash_experts(const int32_t* tokens, int n) const {
  if (!hash_routed_ || n <= 0) return;
  const int64_t k = hp_.n_expert_used;
  std::vector<char> wanted(static_cast<size_t>(hp_.n_expert), 0);
  for (int t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) wanted[static_cast<size_t>(tid2eid_host_[tokens[t] * k + j])] = 1;
  // Ascending, as run_routed_experts requests them: where the cache has room
  // for only some, those are the ones the layer reads first.
  std::vector<int32_t> experts;
  for (int64_t e = 0; e < hp_.n_expert; ++e)
    if (wanted[static_cast<size_t>(e)]) experts.push_back(static_cast<int32_t>(e));
  experts_->prefetch(static_cast<int>(layer_), experts.data(), static_cast<int>(experts.size()));
}

GuessRouter MoeBlock::guess_router() const {
  if (hash_routed_) throw ModelError("layer " + std::to_string(layer_) + " routes by token id: nothing to guess");
  return {static_cast<int>(layer_), gate_inp_, GuessRouter::Gating::sqrt_softplus, probs_bias_};
}

void MoeBlock::forward(const Tensor& x, const Tensor& tokens, const int32_t* host_tokens, const Tensor& out,
                       const NextGuess& next) {
  const bool guess = next.guesser && next.router;
  Routing r = route(x, tokens, host_tokens, guess ? next.guesser->per_layer() : 0);
  // Right behind this layer's router, ahead of its ids' download (next_layer_guess.h).
  if (guess) next.guesser->enqueue(be_, next, r);
  const int64_t d = hp_.n_embd, ff = hp_.n_ff_exp;
  // The shared expert while the host waits for the routing's ids; the routed
  // sum (in rank order, as llama.cpp adds its expert views) goes on top of it.
  const auto shared = [&] { gated_ffn(be_, shared_, swiglu_shexp_, x, out); };
  run_routed_experts(be_, *experts_, static_cast<int>(layer_), x, r,
                     {[&](const ExpertWeights& ew) {
                        const std::string who = "layer " + std::to_string(layer_) + " expert " + std::to_string(ew.expert);
                        return expert_matrices(ew, d, ff, d, who);
                      },
                      swiglu_exp_},
                     /*accumulate=*/true, out, next.guesser, shared);
}

}  // namespace xrun::ds4
