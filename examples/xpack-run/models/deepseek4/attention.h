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

#include "../../backend.h"
#include "../../row_window.h"
#include "compressor.h"
#include "ds4_ops.h"
#include "hparams.h"

namespace xrun::ds4 {

class Attention {
 public:
  Attention(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, int64_t layer);

  // x: attention input (after attn_norm) of positions pos0 .. pos0+n-1,
  // [n][n_embd]; writes out [n][n_embd]. Positions must continue the sequence.
  void forward(const Tensor& x, int64_t pos0, const Tensor& out);
  void reset();

 private:
  void project_output(const Tensor& heads, const Tensor& out) const;

  const Hparams& hp_;
  Backend& be_;
  Ds4Ops& ops_;
  AttnKind kind_;
  RopeSpec rope_, idx_rope_;

  Tensor wq_a_, q_a_norm_, wq_b_, wkv_, kv_norm_, sinks_, wo_a_, wo_b_;

  std::unique_ptr<Compressor> compressor_;      // CSA and HCA
  std::unique_ptr<Compressor> idx_compressor_;  // CSA: the indexer's keys
  Tensor idx_q_b_, idx_proj_;

  // Raw keys of the positions a later query can still see.
  RowWindow raw_keys_;
  int64_t next_pos_ = 0;
};

}  // namespace xrun::ds4
