// Kimi-K3 (GGUF arch "kimi-k3"): shared declarations of the model's parts.
//
// The model is Kimi-Linear's hybrid stack plus five additions; each part lives
// in its own file so the code reads like the model card:
//   hparams.cpp   hyperparameters, all from GGUF metadata
//   kda.cpp       Kimi Delta Attention: short convolutions + gated delta rule
//                 (recurrent; layers whose attention.head_count_kv is 0)
//   mla.cpp       multi-head latent attention, nope-only, with a sigmoid output gate
//   ffn.cpp       situ activation, the leading dense FFN and the latent MoE
//   model.cpp     the layer stack with cross-layer residual attention, the factory
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../experts.h"
#include "../../weights.h"

namespace xrun::kimi_k3 {

// ggml's expert gating functions (llama_expert_gating_func_type).
enum class Gating : int { softmax = 1, sigmoid = 2, softmax_weight = 3, sqrt_softplus = 4 };

struct Hparams {
  int n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_vocab = 0;
  int64_t n_head = 0;  // KDA and MLA share it
  float norm_eps = 0;
  std::vector<bool> is_kda;  // per layer: head_count_kv == 0

  // KDA
  int64_t kda_head_dim = 0;
  int64_t d_conv = 0;
  int64_t d_inner = 0;  // kda_head_dim * n_head
  bool has_gate_lower_bound = false;
  float gate_lower_bound = 0;

  // MLA
  int64_t q_lora_rank = 0;  // 0: no q LoRA (attn_q)
  int64_t kv_lora_rank = 0;
  int64_t head_k_mla = 0;  // qk_nope + qk_rope
  int64_t head_v_mla = 0;
  int64_t qk_rope = 0;  // rope.dimension_count; no RoPE is applied (nope-only MLA)
  int64_t qk_nope = 0;

  // FFN
  int n_dense_lead = 0;
  std::vector<int64_t> n_ff;  // dense width per layer
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_expert_shared = 0;
  int64_t n_latent = 0;  // routed experts' width (n_embd when expert_latent_length is 0)
  bool has_latent = false;  // expert_latent_length > 0: routed down/up projections exist
  Gating gating = Gating::sigmoid;
  bool weights_norm = false;
  float weights_scale = 0;
  float situ_beta = 0;
  float situ_linear_beta = 0;

  // cross-layer residual attention: 0 disables it
  int64_t res_block_size = 0;

  static Hparams load(const Weights& w);
};

// ---- small shared helpers (ops.h has the heavy ones) ----

// ggml_rms_norm semantics: x / sqrt(mean(x^2) + eps) (sum in double), times weight if given.
void rms_norm_row(const float* x, const float* weight, int64_t n, float eps, float* y);
// ggml_soft_max semantics (sum in double).
void softmax_row(float* x, int64_t n);
std::string layer_name(int il, const char* what);

// ---- KDA ----

struct KdaState {
  std::vector<float> conv[3];  // q, k, v: the last d_conv-1 projected inputs, [d_conv-1][d_inner]
  std::vector<float> s;        // per head [head_dim key][head_dim value]
};

class KdaLayer {
 public:
  KdaLayer(const Weights& w, const Hparams& hp, int il);
  void init_state(KdaState& st) const;
  // x: attn-normed input [n][n_embd]; out: [n][n_embd].
  void forward(const float* x, int n, KdaState& st, float* out) const;

 private:
  const Hparams& hp_;
  const WeightTensor *wq_, *wk_, *wv_, *f_a_, *f_b_, *beta_, *g_, *wo_;
  std::vector<float> conv_w_[3];  // [d_inner][d_conv]
  std::vector<float> a_;          // ssm_a = -exp(A_log), per head
  std::vector<float> dt_bias_;    // [d_inner]
  std::vector<float> o_norm_;     // [head_dim]
};

// ---- MLA ----

struct MlaCache {
  // per cached position: [kv_lora_rank normed latent | qk_rope key part]
  std::vector<float> kv;
  int64_t n = 0;
};

class MlaLayer {
 public:
  MlaLayer(const Weights& w, const Hparams& hp, int il);
  // x: attn-normed input [n][n_embd] at positions cache.n ...; out: [n][n_embd].
  void forward(const float* x, int n, MlaCache& cache, float* out) const;

 private:
  const Hparams& hp_;
  const WeightTensor *wq_a_ = nullptr, *wq_b_ = nullptr, *wq_ = nullptr, *wkv_a_, *gate_ = nullptr,
                     *wo_;
  std::vector<float> q_a_norm_, kv_a_norm_;
  std::vector<float> k_b_;  // per head [kv_lora_rank][qk_nope]: q_nope -> latent (absorbed)
  std::vector<float> v_b_;  // per head [head_v][kv_lora_rank]: latent -> value
};

// ---- FFN ----

// situ(g, u) = b*tanh(g/b)*sigmoid(g) * bl*tanh(u/bl); bl <= 0 leaves u as is.
float situ(float g, float u, float beta, float linear_beta);

class DenseFfn {
 public:
  DenseFfn(const Weights& w, const Hparams& hp, int il);
  void forward(const float* x, int n, float* out) const;

 private:
  const Hparams& hp_;
  const WeightTensor *gate_, *up_, *down_;
};

class LatentMoe {
 public:
  LatentMoe(const Weights& w, const Hparams& hp, int il, ExpertSource* experts);
  void forward(const float* x, int n, float* out) const;

 private:
  void route(const float* x, int n, std::vector<int32_t>& ids, std::vector<float>& weights) const;
  void routed_experts(const float* latent_in, int n, const std::vector<int32_t>& ids,
                      const std::vector<float>& weights, float* latent_out) const;

  const Hparams& hp_;
  int il_;
  ExpertSource* experts_;
  const WeightTensor* gate_inp_;
  std::vector<float> probs_b_;  // selection bias (may be empty)
  const WeightTensor *routed_down_ = nullptr, *routed_up_ = nullptr;
  std::vector<float> routed_norm_;  // may be empty
  const WeightTensor *gate_sh_ = nullptr, *up_sh_ = nullptr, *down_sh_ = nullptr;
};

}  // namespace xrun::kimi_k3
