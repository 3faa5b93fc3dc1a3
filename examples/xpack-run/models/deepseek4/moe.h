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
// Every selected expert is computed. In a batch, tokens are grouped by expert
// so each expert's weights are fetched once (one ExpertSource::for_each call
// per layer) and run as one matmul batch over its tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "../../experts.h"
#include "hparams.h"

namespace xrun::ds4 {

class MoeBlock {
 public:
  MoeBlock(const Weights& w, const Hparams& hp, int64_t layer, ExpertSource* experts);

  // x: FFN input (after ffn_norm) [n][n_embd]; tokens: the token ids of the
  // rows (hash routing); writes out [n][n_embd].
  void forward(const float* x, const int32_t* tokens, int n, float* out);

 private:
  struct Route {
    std::vector<int32_t> ids;    // [n][k]
    std::vector<float> weights;  // [n][k]
  };
  Route route(const float* x, const int32_t* tokens, int n) const;
  void shared_expert(const float* x, int n, float* out) const;

  const Hparams& hp_;
  int64_t layer_;
  ExpertSource* experts_;
  const WeightTensor* gate_inp_;
  std::vector<float> probs_bias_;      // exp_probs_b (learned-router layers)
  const WeightTensor* tid2eid_ = nullptr;  // token -> expert ids (hash layers)
  const WeightTensor* gate_sh_;
  const WeightTensor* up_sh_;
  const WeightTensor* down_sh_;
  float clamp_exp_, clamp_shexp_;
};

// silu(min(gate, L)) * clamp(up, -L, L), in place into gate; L <= 1e-6 means
// plain SwiGLU.
void clamped_swiglu(float* gate, const float* up, int64_t n, float limit);

}  // namespace xrun::ds4
