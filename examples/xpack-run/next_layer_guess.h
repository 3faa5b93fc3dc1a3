// Next-layer prefetch (--prefetch-next N): while MoE layer L computes, guess
// the experts of the next MoE layer by applying that layer's router to L's
// routing input, and hand the guess to the expert source as a prefetch, so a
// cache starts those reads at low priority (xpack_cache_prefetch: its loads
// wait behind demand loads, may displace only what the policy values no more,
// and expire after a step).
//
// Where it sits in a layer (run_routed_experts): the guess's scores and top-N
// are enqueued right after L's own router, into the same I32 allocation as L's
// expert ids (make_routing), so the one download of L's ids, the layer's one
// host synchronisation, brings the guess too: no extra wait, only the guess's
// few small operations (one n_expert x d product, a top-N) run before that
// download. The prefetch is handed over after L's own acquire, so L's demand
// reads are queued first.
//
// A guess only moves reads earlier: what a layer computes is its own routing,
// whatever was guessed. It is counted here, apart from exact hints such as
// deepseek4's hash layers (the expert cache's prefetch_* counters count the
// loads both start): guessed experts issued, those the layer then routed to
// (used), and the experts the guessed layers routed to (routed).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend.h"
#include "experts.h"

namespace xrun {

struct Routing;

// How a MoE layer's router selects, as far as a guess of its choice needs:
// the top-k of gating(gate_inp . x) + bias.
struct GuessRouter {
  enum class Gating { none, softmax, sigmoid, sqrt_softplus };
  int layer = -1;     // GGUF block
  Tensor gate_inp;    // [n_expert][d]
  Gating gating = Gating::none;
  Tensor bias;        // F32 [n_expert] selection bias; empty: none
};

// A guess to make while a layer runs: `router`'s choice for `state` [n][d].
class NextLayerGuesser;
struct NextGuess {
  NextLayerGuesser* guesser = nullptr;
  const GuessRouter* router = nullptr;
  Tensor state;
};

// Which state a guess applies the next router to. moe_input: the current
// layer's MoE input, as its own router sees it (after its ffn_norm);
// renormed: the same pre-norm input normalised with the next layer's
// ffn_norm. doc/xpack-run.md, "Next-layer prefetch", compares them.
enum class GuessState { moe_input, renormed };

class NextLayerGuesser {
 public:
  // per_layer: experts guessed per layer and step, >= 1.
  explicit NextLayerGuesser(int per_layer, GuessState state = GuessState::moe_input);
  int per_layer() const { return per_layer_; }
  GuessState state() const { return state_; }
  // Throws ModelError naming --prefetch-next when per_layer exceeds n_expert.
  void check_experts(int64_t n_expert) const;

  // Enqueues the guess of next.router for next.state into r.guess (which
  // make_routing allocated per_layer wide) and sets r.guess_layer.
  void enqueue(Backend& be, const NextGuess& next, Routing& r) const;

  // Host side, from run_routed_experts. score(): layer `layer` routed to
  // `experts` (distinct); a guess made for it this step is scored. issue():
  // the guess ids [n_tokens][per_layer] (best first per token) of `layer`,
  // reduced to at most per_layer experts (by rank-weighted votes over the
  // tokens), are handed to source.prefetch().
  void score(int layer, const std::vector<int32_t>& experts);
  void issue(ExpertSource& source, int layer, const int32_t* ids, int64_t n_tokens);

  // next_guess_* counters for --json.
  nlohmann::ordered_json counters_json() const;

 private:
  int per_layer_;
  GuessState state_;
  std::map<int, std::vector<int32_t>> pending_;  // layer -> guessed experts, not yet scored
  uint64_t layer_steps_ = 0, issued_ = 0, used_ = 0, routed_ = 0;
};

}  // namespace xrun
