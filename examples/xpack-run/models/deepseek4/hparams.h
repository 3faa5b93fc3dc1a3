// DeepSeek-V4-Flash (GGUF arch `deepseek4`): the hyperparameters, read only
// from GGUF metadata. Every later section of the model takes its sizes from here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../rope_yarn.h"
#include "../../weights.h"

namespace xrun::ds4 {

// One family of rotary embeddings. The model uses two: plain RoPE on
// sliding-window-only layers and YaRN-scaled RoPE with its own base on every
// layer that compresses its KV (and in the indexer); both rotate the last
// n_dims of each head.
using RopeParams = RopeYarn;

// Per-layer attention kind, from attention.compress_ratios.
enum class AttnKind { kSlidingOnly, kCsa, kHca };

struct Hparams {
  std::string arch;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;        // main layers; trailing MTP (nextn) layers are not run
  int64_t n_head = 0;
  int64_t head_dim = 0;       // one shared K=V head of this width (MQA)
  int64_t n_rot = 0;          // rotated tail of each head (and of each indexer head)
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t n_swa = 0;          // sliding window over raw keys
  float rms_eps = 1e-6f;

  // Compressed attention.
  std::vector<int64_t> compress_ratio;  // per layer: 0, 4 (CSA) or 128 (HCA)
  int64_t idx_n_head = 0;
  int64_t idx_head_dim = 0;
  int64_t idx_top_k = 0;

  RopeParams rope_raw;         // layers with compress ratio 0
  RopeParams rope_compressed;  // layers with compression, their compressors and the indexer

  // Hyper-connections.
  int64_t hc_mult = 0;
  int64_t hc_sinkhorn_iters = 0;
  float hc_eps = 1e-6f;

  // Mixture of experts.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;     // expert_feed_forward_length * expert_shared_count
  int64_t n_hash_layers = 0;  // layers < this route by token id
  bool expert_weights_norm = false;
  float expert_weights_scale = 1.0f;
  std::vector<float> swiglu_clamp_exp;    // per layer; <= 1e-6 disables the clamp
  std::vector<float> swiglu_clamp_shexp;  // per layer

  AttnKind attn_kind(int64_t layer) const;
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
};

// Reads and validates every hyperparameter; throws ModelError naming the key.
Hparams load_hparams(const Weights& w);

// Tensor name of block `layer`: blk.N.<suffix>.
std::string blk(int64_t layer, const std::string& suffix);

}  // namespace xrun::ds4
