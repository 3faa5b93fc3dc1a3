// Kimi-K3 hyperparameters, read only from GGUF metadata (as llama.cpp's
// llama_model_kimi_k3::load_arch_hparams reads them). Optional keys default to
// llama.cpp's defaults; a missing required key throws ModelError naming it.
#include <cmath>
#include <string>

#include "kimi_k3.h"

namespace xrun::kimi_k3 {

namespace {

int64_t positive(const std::string& key, int64_t v) {
  if (v <= 0) throw ModelError("kimi-k3: key " + key + " must be positive (got " + std::to_string(v) + ")");
  return v;
}

int64_t req_pos(const Weights& w, const char* suffix) {
  const std::string key = w.arch_key(suffix);
  return positive(key, w.get_int(key));
}

}  // namespace

Hparams Hparams::load(const Weights& w) {
  Hparams hp;
  hp.n_layer = static_cast<int>(req_pos(w, "block_count"));
  hp.n_embd = req_pos(w, "embedding_length");
  hp.norm_eps = static_cast<float>(w.get_float(w.arch_key("attention.layer_norm_rms_epsilon")));

  // llama.cpp sizes every head-count-dependent tensor with n_head() (layer 0's value).
  hp.n_head = static_cast<int64_t>(w.get_per_layer(w.arch_key("attention.head_count"), hp.n_layer)[0]);
  positive(w.arch_key("attention.head_count"), hp.n_head);

  const WeightTensor& embd = w.get("token_embd.weight");
  hp.n_vocab = embd.ne[1];
  if (embd.ne[0] != hp.n_embd)
    throw ModelError("kimi-k3: token_embd.weight has ne0 " + std::to_string(embd.ne[0]) +
                     ", expected embedding_length " + std::to_string(hp.n_embd));

  // head_count_kv == 0 marks a KDA (recurrent) layer, as in kimi-linear.
  const std::vector<double> n_head_kv = w.get_per_layer(w.arch_key("attention.head_count_kv"), hp.n_layer);
  hp.is_kda.resize(hp.n_layer);
  for (int il = 0; il < hp.n_layer; ++il) hp.is_kda[il] = n_head_kv[il] == 0;

  // KDA
  hp.kda_head_dim = req_pos(w, "kda.head_dim");
  hp.d_conv = req_pos(w, "ssm.conv_kernel");
  hp.d_inner = hp.kda_head_dim * hp.n_head;
  const std::string lb_key = w.arch_key("kda.gate_lower_bound");
  hp.has_gate_lower_bound = w.has(lb_key) && std::isfinite(w.get_float(lb_key));
  hp.gate_lower_bound = hp.has_gate_lower_bound ? static_cast<float>(w.get_float(lb_key)) : 0.0f;

  // MLA (only required when the model has an MLA layer)
  bool any_mla = false;
  for (bool k : hp.is_kda) any_mla |= !k;
  if (any_mla) {
    hp.q_lora_rank = w.get_int(w.arch_key("attention.q_lora_rank"), 0);
    hp.kv_lora_rank = req_pos(w, "attention.kv_lora_rank");
    hp.head_k_mla = req_pos(w, "attention.key_length_mla");
    hp.head_v_mla = req_pos(w, "attention.value_length_mla");
    hp.qk_rope = w.get_int(w.arch_key("rope.dimension_count"));
    hp.qk_nope = hp.head_k_mla - hp.qk_rope;
    if (hp.qk_rope < 0 || hp.qk_nope <= 0)
      throw ModelError("kimi-k3: rope.dimension_count " + std::to_string(hp.qk_rope) +
                       " does not fit attention.key_length_mla " + std::to_string(hp.head_k_mla));
  }

  // FFN
  hp.n_dense_lead = static_cast<int>(w.get_int(w.arch_key("leading_dense_block_count"), 0));
  if (hp.n_dense_lead < 0 || hp.n_dense_lead > hp.n_layer)
    throw ModelError("kimi-k3: leading_dense_block_count out of range");
  hp.n_ff.assign(hp.n_layer, 0);
  if (hp.n_dense_lead > 0) {
    const std::vector<double> ff = w.get_per_layer(w.arch_key("feed_forward_length"), hp.n_layer);
    for (int il = 0; il < hp.n_dense_lead; ++il)
      hp.n_ff[il] = positive(w.arch_key("feed_forward_length"), static_cast<int64_t>(ff[il]));
  }
  if (hp.n_dense_lead < hp.n_layer) {
    hp.n_expert = req_pos(w, "expert_count");
    hp.n_expert_used = req_pos(w, "expert_used_count");
    if (hp.n_expert_used > hp.n_expert)
      throw ModelError("kimi-k3: expert_used_count exceeds expert_count");
    hp.n_ff_exp = req_pos(w, "expert_feed_forward_length");
    hp.n_expert_shared = w.get_int(w.arch_key("expert_shared_count"));
    hp.n_latent = w.get_int(w.arch_key("expert_latent_length"));
    hp.has_latent = hp.n_latent > 0;
    if (!hp.has_latent) hp.n_latent = hp.n_embd;
    const int64_t gating = w.get_int(w.arch_key("expert_gating_func"));
    if (gating < 1 || gating > 4)
      throw ModelError("kimi-k3: unsupported expert_gating_func " + std::to_string(gating));
    hp.gating = static_cast<Gating>(gating);
    hp.weights_norm = w.get_bool(w.arch_key("expert_weights_norm"), false);
    hp.weights_scale = static_cast<float>(w.get_float(w.arch_key("expert_weights_scale"), 0.0));
    if (w.get_int(w.arch_key("expert_group_count"), 0) > 1)
      throw ModelError("kimi-k3: grouped expert routing (expert_group_count > 1) is not supported");
  }
  hp.situ_beta = static_cast<float>(w.get_float(w.arch_key("activation.situ_beta")));
  hp.situ_linear_beta = static_cast<float>(w.get_float(w.arch_key("activation.situ_linear_beta")));
  if (!(hp.situ_beta > 0.0f)) throw ModelError("kimi-k3: activation.situ_beta must be positive");

  hp.res_block_size = w.get_int(w.arch_key("attn_res.block_size"));
  if (hp.res_block_size < 0) throw ModelError("kimi-k3: attn_res.block_size is negative");
  return hp;
}

}  // namespace xrun::kimi_k3
