// DeepSeek-V4 attention of one block.
//
//  - Queries: low-rank (attn_q_a -> attn_q_a_norm -> attn_q_b), n_head heads,
//    each RMS-normalised without weight; the last n_rot dims are rotated.
//  - Keys = values: one shared head (MQA) from attn_kv + attn_kv_a_norm, its
//    last n_rot dims rotated. Every head attends to the same vectors.
//  - Keys visible to a query at position q:
//      raw keys of positions (q - sliding_window, q];
//      plus, on compressed layers, keys of whole blocks that ended at or
//      before q: all of them for HCA (ratio 128); for CSA (ratio 4) only the
//      top-k blocks chosen by the lightning indexer.
//  - One softmax over all visible keys and a learned per-head sink logit that
//    takes probability mass without contributing a value.
//  - The output's rotated dims are un-rotated at the query position, then
//    heads are projected in groups (attn_output_a per group, low rank) and
//    the concatenated groups mapped back (attn_output_b).
// Compressed layers rotate with compress_rope_freq_base and YaRN; raw layers
// with rope.freq_base.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "compressor.h"
#include "hparams.h"

namespace xrun::ds4 {

class Attention {
 public:
  Attention(const Weights& w, const Hparams& hp, int64_t layer);

  // x: attention input (after attn_norm) of positions pos0 .. pos0+n-1,
  // [n][n_embd]; writes out [n][n_embd]. Positions must continue the sequence.
  void forward(const float* x, int n, int64_t pos0, float* out);
  void reset();

 private:
  // Lightning indexer: the compressed blocks query t may attend to.
  void select_blocks(const float* idx_q, const float* idx_w, int64_t n_visible,
                     std::vector<int64_t>& chosen) const;
  void attend(const float* q, int64_t pos, const std::vector<int64_t>& blocks, float* out) const;
  void project_output(const float* heads, int n, float* out) const;

  const Hparams& hp_;
  int64_t layer_;
  AttnKind kind_;
  const RopeParams& rope_;

  const WeightTensor* wq_a_;
  std::vector<float> q_a_norm_;
  const WeightTensor* wq_b_;
  const WeightTensor* wkv_;
  std::vector<float> kv_norm_;
  std::vector<float> sinks_;
  const WeightTensor* wo_a_;
  const WeightTensor* wo_b_;

  std::unique_ptr<Compressor> compressor_;  // CSA and HCA
  std::unique_ptr<Compressor> idx_compressor_;  // CSA: the indexer's keys
  const WeightTensor* idx_q_b_ = nullptr;
  const WeightTensor* idx_proj_ = nullptr;

  // Raw keys of positions [raw_pos0_, raw_pos0_ + raw_count), head_dim each:
  // only those a later query can still see are kept.
  std::vector<float> raw_keys_;
  int64_t raw_pos0_ = 0;
  int64_t next_pos_ = 0;
};

}  // namespace xrun::ds4
