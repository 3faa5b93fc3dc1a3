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
//   kimi_ops.h    the operations only this model uses (situ, residual mix, KDA's
//                 convolution, gate and delta rule, the MLA core), CPU versions in *_cpu.cpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../backend.h"
#include "../../experts.h"
#include "../../gated_ffn.h"
#include "../../routed_experts.h"
#include "../../weights.h"
#include "kimi_ops.h"

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

std::string layer_name(int il, const char* what);

// ---- KDA ----

struct KdaState {
  Tensor conv[3];  // q, k, v: the last d_conv-1 projected inputs, [d_conv-1][d_inner]
  Tensor s;        // per head [head_dim key][head_dim value]
};

class KdaLayer {
 public:
  KdaLayer(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il);
  void init_state(KdaState& st) const;
  // x: attn-normed input [n][n_embd]; out: [n][n_embd].
  void forward(const Tensor& x, KdaState& st, const Tensor& out) const;

 private:
  const Hparams& hp_;
  Backend& be_;
  KimiOps& ops_;
  Tensor wq_, wk_, wv_, f_a_, f_b_, beta_, g_, wo_;
  Tensor conv_w_[3];  // [d_inner][d_conv]
  Tensor a_;          // ssm_a = -exp(A_log), per head
  Tensor dt_bias_;    // [d_inner]
  Tensor o_norm_;     // [head_dim]
};

// ---- MLA ----

struct MlaCache {
  Tensor latent;    // [capacity][kv_lora_rank]: normed latents of the cached positions
  Tensor rope_key;  // [capacity][qk_rope]: their rope-part keys
  int64_t n = 0;
};

class MlaLayer {
 public:
  MlaLayer(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il);
  void init_cache(MlaCache& cache) const;
  // x: attn-normed input [n][n_embd] at positions cache.n ...; out: [n][n_embd].
  void forward(const Tensor& x, MlaCache& cache, const Tensor& out) const;

 private:
  const Hparams& hp_;
  Backend& be_;
  KimiOps& ops_;
  Tensor wq_a_, wq_b_, wq_, wkv_latent_, wkv_rope_, gate_, wo_;
  bool q_lora_ = false, has_gate_ = false;
  Tensor q_a_norm_, kv_a_norm_;
  Tensor k_b_;  // per head [kv_lora_rank][qk_nope]: q_nope -> latent (absorbed)
  Tensor v_b_;  // per head [head_v][kv_lora_rank]: latent -> value
};

// ---- FFN ----

class DenseFfn {
 public:
  DenseFfn(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il);
  void forward(const Tensor& x, const Tensor& out) const;

 private:
  Backend& be_;
  GatedMatrices m_;
  GateActivation situ_;
};

class LatentMoe {
 public:
  LatentMoe(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il, ExpertSource* experts);
  // next: the next MoE layer's guess to make meanwhile (next_layer_guess.h); empty: none.
  void forward(const Tensor& x, const Tensor& out, const NextGuess& next = {}) const;
  GuessRouter guess_router() const;

 private:
  Routing route(const Tensor& x, int64_t guess_width) const;

  const Hparams& hp_;
  Backend& be_;
  int il_;
  ExpertSource* experts_;
  GateActivation situ_;
  Tensor gate_inp_;
  Tensor probs_b_;  // selection bias
  bool has_probs_b_ = false;
  Tensor routed_down_, routed_up_, routed_norm_;
  bool has_routed_norm_ = false;
  GatedMatrices shared_;
  bool has_shared_ = false;
};

// situ(g, u) as the activation of a gated FFN.
GateActivation situ_activation(const Hparams& hp, KimiOps& ops);

}  // namespace xrun::kimi_k3
