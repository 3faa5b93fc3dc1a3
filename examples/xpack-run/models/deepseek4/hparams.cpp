// Hyperparameters of deepseek4, with the same defaults llama.cpp applies when
// an optional key is absent (so a model that loads there loads here).
#include "hparams.h"

#include <cmath>

namespace xrun::ds4 {

std::string blk(int64_t layer, const std::string& suffix) {
  return "blk." + std::to_string(layer) + "." + suffix;
}

AttnKind Hparams::attn_kind(int64_t layer) const {
  switch (compress_ratio[static_cast<size_t>(layer)]) {
    case 0: return AttnKind::kSlidingOnly;
    case 4: return AttnKind::kCsa;
    default: return AttnKind::kHca;
  }
}

namespace {

int64_t positive(const Weights& w, const std::string& key) {
  int64_t v = w.get_int(key);
  if (v <= 0) throw ModelError("key " + key + " must be positive, got " + std::to_string(v));
  return v;
}

// The CSA compressor overlaps two 4-position windows and HCA collapses 128;
// those are the only ratios whose tensors and state layouts are defined.
void check_ratio(int64_t ratio, int64_t layer, const std::string& key) {
  if (ratio != 0 && ratio != 4 && ratio != 128) {
    throw ModelError("key " + key + "[" + std::to_string(layer) + "] = " + std::to_string(ratio) +
                     " is unsupported (only 0, 4 and 128)");
  }
}

std::vector<float> per_layer(const Weights& w, const std::string& key, int64_t n_all, int64_t n_main) {
  std::vector<double> v = w.get_per_layer(key, static_cast<int>(n_all));
  return std::vector<float>(v.begin(), v.begin() + n_main);
}

}  // namespace

Hparams load_hparams(const Weights& w) {
  Hparams h;
  h.arch = w.arch();
  auto key = [&](const std::string& s) { return w.arch_key(s); };

  const int64_t n_layer_all = positive(w, key("block_count"));
  // MTP (nextn) blocks sit after the main layers; they only count as such
  // when their tensors are really there, as llama.cpp decides.
  int64_t n_nextn = w.get_int(key("nextn_predict_layers"), 0);
  if (n_nextn < 0 || n_nextn >= n_layer_all) n_nextn = 0;
  if (n_nextn > 0 && !w.find(blk(n_layer_all - n_nextn, "nextn.eh_proj.weight"))) n_nextn = 0;
  h.n_layer = n_layer_all - n_nextn;

  h.n_embd = positive(w, key("embedding_length"));
  h.n_head = positive(w, key("attention.head_count"));
  const int64_t n_head_kv = w.get_int(key("attention.head_count_kv"), 1);
  if (n_head_kv != 1) {
    throw ModelError("key " + key("attention.head_count_kv") + " = " + std::to_string(n_head_kv) +
                     " is unsupported (DeepSeek-V4 attention has one shared KV head)");
  }
  h.head_dim = positive(w, key("attention.key_length"));
  const int64_t v_dim = w.get_int(key("attention.value_length"), h.head_dim);
  if (v_dim != h.head_dim) {
    throw ModelError("key " + key("attention.value_length") + " must equal attention.key_length (K and V share one vector)");
  }
  h.n_rot = w.get_int(key("rope.dimension_count"), h.head_dim);
  if (h.n_rot <= 0 || h.n_rot > h.head_dim || h.n_rot % 2 != 0) {
    throw ModelError("key " + key("rope.dimension_count") + " = " + std::to_string(h.n_rot) +
                     " must be even and within the head");
  }
  h.q_lora_rank = positive(w, key("attention.q_lora_rank"));
  h.o_groups = positive(w, key("attention.output_group_count"));
  h.o_lora_rank = positive(w, key("attention.output_lora_rank"));
  if (h.n_head % h.o_groups != 0) {
    throw ModelError("key " + key("attention.output_group_count") + " must divide attention.head_count");
  }
  h.n_swa = positive(w, key("attention.sliding_window"));
  h.rms_eps = static_cast<float>(w.get_float(key("attention.layer_norm_rms_epsilon")));

  // Per-layer compression.
  const std::string ratios_key = key("attention.compress_ratios");
  std::vector<int64_t> ratios = w.get_int_array(ratios_key);
  if (static_cast<int64_t>(ratios.size()) < n_layer_all) {
    throw ModelError("key " + ratios_key + " has " + std::to_string(ratios.size()) +
                     " values, fewer than block_count (" + std::to_string(n_layer_all) + ")");
  }
  h.compress_ratio.assign(ratios.begin(), ratios.begin() + h.n_layer);
  bool any_csa = false;
  for (int64_t il = 0; il < h.n_layer; ++il) {
    check_ratio(h.compress_ratio[il], il, ratios_key);
    any_csa = any_csa || h.compress_ratio[il] == 4;
  }
  if (any_csa) {
    h.idx_n_head = positive(w, key("attention.indexer.head_count"));
    h.idx_head_dim = positive(w, key("attention.indexer.key_length"));
    h.idx_top_k = positive(w, key("attention.indexer.top_k"));
    if (h.n_rot > h.idx_head_dim) {
      throw ModelError("key " + key("attention.indexer.key_length") + " is smaller than rope.dimension_count");
    }
  }

  // RoPE. Uncompressed layers rotate plainly with rope.freq_base; compressed
  // layers use compress_rope_freq_base with the model's (YaRN) scaling.
  h.rope_raw.n_dims = static_cast<int>(h.n_rot);
  h.rope_raw.freq_base = static_cast<float>(w.get_float(key("rope.freq_base"), 10000.0));

  RopeParams& rc = h.rope_compressed;
  rc.n_dims = static_cast<int>(h.n_rot);
  rc.freq_base = static_cast<float>(w.get_float(key("attention.compress_rope_freq_base")));
  const std::string scaling_type = w.has(key("rope.scaling.type")) ? w.get_string(key("rope.scaling.type")) : "linear";
  if (scaling_type != "none" && scaling_type != "linear" && scaling_type != "yarn") {
    throw ModelError("key " + key("rope.scaling.type") + " = " + scaling_type + " is unsupported");
  }
  double factor = w.get_float(key("rope.scaling.factor"), 0.0);
  rc.freq_scale = factor == 0.0 ? 1.0f : static_cast<float>(1.0 / factor);
  rc.ext_factor = scaling_type == "yarn" ? 1.0f : 0.0f;
  rc.n_ctx_orig = static_cast<int>(
      w.get_int(key("rope.scaling.original_context_length"), w.get_int(key("context_length"), 0)));
  rc.beta_fast = static_cast<float>(w.get_float(key("rope.scaling.yarn_beta_fast"), 32.0));
  rc.beta_slow = static_cast<float>(w.get_float(key("rope.scaling.yarn_beta_slow"), 1.0));
  // The rotation is scaled by attn_factor * (1 + 0.1 ln(1/freq_scale)) under
  // YaRN; DeepSeek-V4 cancels that magnitude change, keeping unit-norm rotations.
  rc.attn_factor = rc.ext_factor == 0.0f ? 1.0f : 1.0f / (1.0f + 0.1f * std::log(1.0f / rc.freq_scale));

  // Hyper-connections.
  h.hc_mult = positive(w, key("hyper_connection.count"));
  h.hc_sinkhorn_iters = positive(w, key("hyper_connection.sinkhorn_iterations"));
  h.hc_eps = static_cast<float>(w.get_float(key("hyper_connection.epsilon")));

  // Mixture of experts.
  h.n_expert = positive(w, key("expert_count"));
  h.n_expert_used = positive(w, key("expert_used_count"));
  if (h.n_expert_used > h.n_expert) {
    throw ModelError("key " + key("expert_used_count") + " exceeds expert_count");
  }
  h.n_ff_exp = positive(w, key("expert_feed_forward_length"));
  h.n_ff_shexp = h.n_ff_exp * positive(w, key("expert_shared_count"));
  h.n_hash_layers = w.get_int(key("hash_layer_count"));
  if (h.n_hash_layers < 0) throw ModelError("key " + key("hash_layer_count") + " is negative");
  const int64_t gating = w.get_int(key("expert_gating_func"));
  if (gating != 4) {
    throw ModelError("key " + key("expert_gating_func") + " = " + std::to_string(gating) +
                     " is unsupported (DeepSeek-V4 scores experts with sqrt(softplus), gating 4)");
  }
  if (!w.has(key("expert_weights_norm"))) throw ModelError("missing key " + key("expert_weights_norm"));
  h.expert_weights_norm = w.get_bool(key("expert_weights_norm"), false);
  h.expert_weights_scale = static_cast<float>(w.get_float(key("expert_weights_scale")));
  h.swiglu_clamp_exp = per_layer(w, key("swiglu_clamp_exp"), n_layer_all, h.n_layer);
  h.swiglu_clamp_shexp = w.has(key("swiglu_clamp_shexp"))
                             ? per_layer(w, key("swiglu_clamp_shexp"), n_layer_all, h.n_layer)
                             : h.swiglu_clamp_exp;

  const WeightTensor& embd = w.get("token_embd.weight");
  if (embd.ne[0] != h.n_embd) {
    throw ModelError("tensor token_embd.weight rows are " + std::to_string(embd.ne[0]) +
                     " wide, expected embedding_length " + std::to_string(h.n_embd));
  }
  h.n_vocab = embd.ne[1];
  return h;
}

}  // namespace xrun::ds4
