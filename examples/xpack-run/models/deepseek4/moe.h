// DeepSeek-V4 feed-forward: routed experts plus one shared expert.
//
//  - Router scores: s = sqrt(softplus(ffn_gate_inp . x)) for every expert.
//  - Selection: the first hash_layer_count layers take their experts from the
//    token id (ffn_gate_tid2eid); the others take the top-k of s + exp_probs_b
//    (the bias only steers selection).
//  - Weights: the unbiased s of the chosen experts, divided by their sum
//    (expert_weights_norm) and multiplied by expert_weights_scale.
//  - Expert FFN: clamped SwiGLU, silu(min(gate, L)) * clamp(up, -L, L) with
//    L = swiglu_clamp_exp of the layer (no clamp when L <= 1e-6); the shared
//    expert uses swiglu_clamp_shexp.
// Every selected expert is computed, through the shared dispatcher
// (routed_experts.h): one acquire per layer, one matmul batch per expert.
// A hash layer's experts are known from the token ids alone, so the model
// hands them to the expert source as a prefetch when a step begins
// (prefetch_hash_experts), before any layer runs. A learned-router layer's
// experts can only be guessed: with --prefetch-next, the layer before applies
// this one's router to its own state (next_layer_guess.h, guess_router()).
#pragma once

#include <cstdint>

#include "../../backend.h"
#include "../../experts.h"
#include "../../gated_ffn.h"
#include "../../next_layer_guess.h"
#include "../../routed_experts.h"
#include "hparams.h"

namespace xrun::ds4 {

class MoeBlock {
 public:
  MoeBlock(const Weights& w, const Hparams& hp, Backend& be, int64_t layer, ExpertSource* experts);

  // x: FFN input (after ffn_norm) [n][n_embd]; tokens: I32 [n], the token ids
  // of the rows (hash routing), and the same ids on the host (host_tokens, in
  // the vocabulary; or null), from which a hash layer's expert ids are read
  // without waiting for the device's; writes out [n][n_embd]. `next`: the guess
  // of the next layer's experts to make meanwhile (next.router), and the
  // guesser that scores guesses made for this layer (next.guesser); empty: none.
  void forward(const Tensor& x, const Tensor& tokens, const int32_t* host_tokens, const Tensor& out,
               const NextGuess& next = {});

  bool hash_routed() const { return hash_routed_; }
  // This layer's selection, for a guess of it (learned-router layers only).
  GuessRouter guess_router() const;

  // Hash-routed layers only (a no-op in the others): hands the experts the
  // table gives these host token ids to the expert source as a prefetch, so
  // their reads start before the layer runs. Exact: forward() will request
  // precisely these experts. `tokens` are in the vocabulary (checked by eval).
  void prefetch_hash_experts(const int32_t* tokens, int n) const;

 private:
  Routing route(const Tensor& x, const Tensor& tokens, const int32_t* host_tokens, int64_t guess_width) const;

  const Hparams& hp_;
  Backend& be_;
  int64_t layer_;
  ExpertSource* experts_;
  Tensor gate_inp_;
  Tensor probs_bias_;  // exp_probs_b (learned-router layers)
  Tensor tid2eid_;     // token -> expert ids (hash layers); empty otherwise
  const int32_t* tid2eid_host_ = nullptr;  // the same table in host memory (the model file's mapping)
  bool hash_routed_ = false;
  GatedMatrices shared_;
  GateActivation swiglu_exp_, swiglu_shexp_;
};

}  // namespace xrun::ds4
