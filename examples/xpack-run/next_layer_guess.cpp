// Next-layer prefetch (see next_layer_guess.h).
#include "next_layer_guess.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "routed_experts.h"
#include "xpack/xpack.h"

namespace xrun {

NextLayerGuesser::NextLayerGuesser(int per_layer, GuessState state) : per_layer_(per_layer), state_(state) {
  if (per_layer < 1) throw ModelError("--prefetch-next: " + std::to_string(per_layer) + " experts per layer (need >= 1)");
}

void NextLayerGuesser::check_experts(int64_t n_expert) const {
  if (per_layer_ > n_expert) {
    throw ModelError("--prefetch-next " + std::to_string(per_layer_) + " is more than the model's " +
                     std::to_string(n_expert) + " experts per layer");
  }
}

void NextLayerGuesser::enqueue(Backend& be, const NextGuess& next, Routing& r) const {
  const GuessRouter& g = *next.router;
  const int64_t n = next.state.rows(), n_expert = g.gate_inp.rows();
  if (r.guess.width() != per_layer_ || r.guess.rows() != n) {
    throw ModelError("next-layer guess of layer " + std::to_string(g.layer) + ": routing has no room for it");
  }
  const Tensor scores = be.empty(XPACK_TYPE_F32, n_expert, n);
  be.matmul(g.gate_inp, next.state, scores);
  // Every gating is monotonic in each row: without a bias the top-N of the
  // raw products is already the router's.
  if (g.bias.data) {
    switch (g.gating) {
      case GuessRouter::Gating::none: break;
      case GuessRouter::Gating::softmax: be.softmax_rows(scores); break;
      case GuessRouter::Gating::sigmoid: be.unary(Unary::sigmoid, scores, scores); break;
      case GuessRouter::Gating::sqrt_softplus: be.unary(Unary::sqrt_softplus, scores, scores); break;
    }
    be.add(scores, g.bias, scores);
  }
  be.top_k(scores, r.guess);
  r.guess_layer = g.layer;
}

void NextLayerGuesser::score(int layer, const std::vector<int32_t>& experts) {
  auto it = pending_.find(layer);
  if (it == pending_.end()) return;
  for (int32_t e : it->second) used_ += std::binary_search(experts.begin(), experts.end(), e);
  routed_ += experts.size();
  pending_.erase(it);
}

void NextLayerGuesser::issue(ExpertSource& source, int layer, const int32_t* ids, int64_t n_tokens) {
  const int64_t w = per_layer_;
  std::vector<int32_t> guess;
  if (n_tokens == 1) {
    guess.assign(ids, ids + w);
  } else {
    // A batch: the experts its tokens rank best, rank r of w worth w - r.
    std::map<int32_t, int64_t> votes;
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t j = 0; j < w; ++j) votes[ids[t * w + j]] += w - j;
    std::vector<std::pair<int64_t, int32_t>> ranked;
    for (const auto& [e, v] : votes) ranked.push_back({-v, e});
    std::sort(ranked.begin(), ranked.end());
    for (int64_t i = 0; i < std::min<int64_t>(w, static_cast<int64_t>(ranked.size())); ++i)
      guess.push_back(ranked[size_t(i)].second);
  }
  // Ascending, as run_routed_experts requests a layer's experts.
  std::sort(guess.begin(), guess.end());
  source.prefetch_guess(layer, guess.data(), static_cast<int>(guess.size()));
  ++layer_steps_;
  issued_ += guess.size();
  pending_[layer] = std::move(guess);
}

nlohmann::ordered_json NextLayerGuesser::counters_json() const {
  return {{"next_guess_per_layer", per_layer_},
          {"next_guess_state", state_ == GuessState::moe_input ? "moe-input" : "renormed"},
          {"next_guess_layer_steps", layer_steps_},
          {"next_guess_issued", issued_},
          {"next_guess_used", used_},
          {"next_guess_routed", routed_},
          {"next_guess_accuracy", issued_ ? double(used_) / double(issued_) : 0.0},
          {"next_guess_recall", routed_ ? double(used_) / double(routed_) : 0.0}};
}

}  // namespace xrun
