// The learned KV compressor. Every position contributes a value row
// (W_kv x) and a score row (W_gate x + ape[pos % ratio]); each block of
// `ratio` positions then becomes one key: a per-channel softmax over the
// scores weights the values, the sum is RMS-normalised and its last n_rot
// dims are rotated at the block's first position.
//
// Two layouts exist:
//  - HCA (ratio 128): a block pools exactly its own positions.
//  - overlapping (ratio 4, used by CSA and by the lightning indexer): rows are
//    two halves wide; block b pools the first half of the previous block's
//    positions together with the second half of its own, so 2*ratio entries
//    per channel (before the first block the missing half is empty).
//
// A block exists once its last position has been seen; it is then final, so
// decode and batch evaluation give the same keys. Only the rows a future
// block can still need are kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hparams.h"

namespace xrun::ds4 {

class Compressor {
 public:
  // prefix: "blk.N.attn_compressor" or "blk.N.indexer_compressor"; width is
  // the compressed key width (head_dim, or the indexer head width).
  Compressor(const Weights& w, const Hparams& hp, const std::string& prefix, int64_t ratio,
             int64_t width, bool overlap);

  // x: the attention input of positions pos0 .. pos0+n-1 ([n][n_embd]),
  // continuing the positions appended so far. Completes every block it can.
  void append(const float* x, int n, int64_t pos0);

  int64_t ratio() const { return ratio_; }
  int64_t width() const { return width_; }
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size() / width_); }
  const float* block(int64_t b) const { return blocks_.data() + b * width_; }
  void reset();

 private:
  void compress_block(int64_t b);
  const float* kv_row(int64_t pos) const;
  const float* score_row(int64_t pos) const;

  const Hparams& hp_;
  int64_t ratio_, width_, row_width_;
  bool overlap_;
  const WeightTensor* wkv_;
  const WeightTensor* wgate_;
  std::vector<float> ape_;   // [ratio][row_width]
  std::vector<float> norm_;  // [width]

  int64_t next_pos_ = 0;     // positions appended so far
  int64_t rows_pos0_ = 0;    // position of the first kept row
  std::vector<float> kv_rows_, score_rows_;
  std::vector<float> blocks_;  // [n_blocks][width]
};

}  // namespace xrun::ds4
