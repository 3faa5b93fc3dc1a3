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
// Every selected expert is computed, through the shared dispatcher
// (routed_experts.h): each distinct expert of the layer is acquired once and
// runs over all of its tokens as one matrix product; the weighted results are
// added back per token in top-k order.
#include <algorithm>
#include <vector>

#include "kimi_k3.h"
#include "xpack/xpack.h"

namespace xrun::kimi_k3 {

namespace {

constexpr uint32_t kF32 = XPACK_TYPE_F32;

}  // namespace

GateActivation situ_activation(const Hparams& hp, KimiOps& ops) {
  const float beta = hp.situ_beta, linear_beta = hp.situ_linear_beta;
  return [&ops, beta, linear_beta](const Tensor& g, const Tensor& u) { ops.situ(g, u, beta, linear_beta); };
}

DenseFfn::DenseFfn(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il)
    : be_(be), situ_(situ_activation(hp, ops)) {
  const int64_t E = hp.n_embd, F = hp.n_ff[il];
  m_.gate = be.weight(w.get(layer_name(il, "ffn_gate.weight"), {E, F}));
  m_.up = be.weight(w.get(layer_name(il, "ffn_up.weight"), {E, F}));
  m_.down = be.weight(w.get(layer_name(il, "ffn_down.weight"), {F, E}));
}

void DenseFfn::forward(const Tensor& x, const Tensor& out) const { gated_ffn(be_, m_, situ_, x, out); }

LatentMoe::LatentMoe(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il, ExpertSource* experts)
    : hp_(hp), be_(be), il_(il), experts_(experts), situ_(situ_activation(hp, ops)) {
  const int64_t E = hp.n_embd, L = hp.n_latent;
  if (!experts_ || !experts_->has_layer(il))
    throw ModelError("kimi-k3: no routed experts for MoE layer " + std::to_string(il) + " (" +
                     layer_name(il, "ffn_gate_exps.weight") + ")");
  if (experts_->n_experts() != hp.n_expert)
    throw ModelError("kimi-k3: expert source has " + std::to_string(experts_->n_experts()) +
                     " experts, expert_count is " + std::to_string(hp.n_expert));
  gate_inp_ = be.weight(w.get(layer_name(il, "ffn_gate_inp.weight"), {E, hp.n_expert}));
  if (const WeightTensor* b = w.find(layer_name(il, "exp_probs_b.bias"))) {
    probs_b_ = float_weight(be, w.get(b->name, {hp.n_expert}));
    has_probs_b_ = true;
  }
  if (hp.has_latent) {
    routed_down_ = be.weight(w.get(layer_name(il, "ffn_routed_down.weight"), {E, L}));
    routed_up_ = be.weight(w.get(layer_name(il, "ffn_routed_up.weight"), {L, E}));
    if (const WeightTensor* rn = w.find(layer_name(il, "ffn_routed_norm.weight"))) {
      routed_norm_ = float_weight(be, w.get(rn->name, {L}));
      has_routed_norm_ = true;
    }
  }
  // shared experts: full width, n_ff_exp * expert_shared_count wide
  if (w.find(layer_name(il, "ffn_gate_shexp.weight"))) {
    const int64_t F = hp.n_ff_exp * std::max<int64_t>(hp.n_expert_shared, 1);
    shared_.gate = be.weight(w.get(layer_name(il, "ffn_gate_shexp.weight"), {E, F}));
    shared_.up = be.weight(w.get(layer_name(il, "ffn_up_shexp.weight"), {E, F}));
    shared_.down = be.weight(w.get(layer_name(il, "ffn_down_shexp.weight"), {F, E}));
    has_shared_ = true;
  }
}

// Router: ids/weights [n][n_expert_used], ids in top-k order.
Routing LatentMoe::route(const Tensor& x, int64_t guess_width) const {
  const int64_t n = x.rows(), NE = hp_.n_expert, K = hp_.n_expert_used;
  const Tensor probs = be_.empty(kF32, NE, n);
  be_.matmul(gate_inp_, x, probs);
  Routing r = make_routing(be_, n, K, guess_width);
  // The bias only steers the selection; the weights use the unbiased probabilities.
  Backend::RouteSpec spec;
  spec.bias = has_probs_b_ ? &probs_b_ : nullptr;
  spec.normalize = hp_.weights_norm;
  spec.floor = 6.103515625e-5f;  // ggml clamps to the smallest f16 normal
  spec.scale = hp_.weights_scale;
  switch (hp_.gating) {
    case Gating::softmax: be_.softmax_rows(probs); break;
    case Gating::sigmoid: spec.gate = Unary::sigmoid; break;
    case Gating::sqrt_softplus: spec.gate = Unary::sqrt_softplus; break;
    case Gating::softmax_weight: {
      // The chosen logits are softmaxed before the normalisation.
      be_.route(probs, {std::nullopt, spec.bias}, r.ids, r.weights);
      be_.softmax_rows(r.weights);
      if (spec.normalize) be_.normalize_rows(r.weights, spec.floor);
      if (spec.scale != 0.0f && spec.scale != 1.0f) be_.scale(r.weights, spec.scale, r.weights);
      return r;
    }
  }
  be_.route(probs, spec, r.ids, r.weights);
  return r;
}

GuessRouter LatentMoe::guess_router() const {
  GuessRouter g{il_, gate_inp_, GuessRouter::Gating::none, has_probs_b_ ? probs_b_ : Tensor{}};
  switch (hp_.gating) {
    case Gating::softmax: g.gating = GuessRouter::Gating::softmax; break;
    case Gating::sigmoid: g.gating = GuessRouter::Gating::sigmoid; break;
    case Gating::softmax_weight: break;  // selects on the raw products
    case Gating::sqrt_softplus: g.gating = GuessRouter::Gating::sqrt_softplus; break;
  }
  return g;
}

void LatentMoe::forward(const Tensor& x, const Tensor& out, const NextGuess& next) const {
  const int64_t n = x.rows(), L = hp_.n_latent, F = hp_.n_ff_exp;
  const bool guess = next.guesser && next.router;
  Routing r = route(x, guess ? next.guesser->per_layer() : 0);
  // Right behind this layer's router, ahead of its ids' download (next_layer_guess.h).
  if (guess) next.guesser->enqueue(be_, next, r);

  // The routed experts' input in the latent width and the shared experts'
  // gate and up: products of x, in one call. The shared experts' output is
  // then computed ahead of the routed ones' and added after them, as before.
  Tensor z = x, sg, su, sh;
  std::vector<Backend::Product> from_x;
  if (hp_.has_latent) {
    z = be_.empty(kF32, L, n);
    from_x.push_back({&routed_down_, &z});
  }
  if (has_shared_) {
    sg = be_.empty(kF32, shared_.gate.rows(), n);
    su = be_.empty(kF32, shared_.up.rows(), n);
    from_x.push_back({&shared_.gate, &sg});
    from_x.push_back({&shared_.up, &su});
  }
  be_.shared_input_matmul(x, from_x);
  // The shared experts' rest while the host waits for the routing's ids.
  const auto shared = [&] {
    if (!has_shared_) return;
    sh = be_.empty(kF32, hp_.n_embd, n);
    gated_ffn_down(be_, shared_, situ_, sg, su, sh);
    sg = su = Tensor{};
  };
  // The routed experts in the latent width, summed per token in top-k order.
  const Tensor y = be_.empty(kF32, L, n);  // every token's picks summed into it
  run_routed_experts(be_, *experts_, il_, z, r,
                     {[&](const ExpertWeights& ew) {
                        const std::string who = "kimi-k3: layer " + std::to_string(il_) + " expert " + std::to_string(ew.expert);
                        return expert_matrices(ew, L, F, L, who);
                      },
                      situ_},
                     /*accumulate=*/false, y, next.guesser, shared);

  if (has_routed_norm_) be_.rms_norm(y, &routed_norm_, hp_.norm_eps, y);
  if (hp_.has_latent)
    be_.matmul(routed_up_, y, out);
  else
    be_.copy(y, out);

  if (has_shared_) be_.add(out, sh, out);
}

}  // namespace xrun::kimi_k3
