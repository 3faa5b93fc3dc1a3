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

#include "../../backend.h"
#include "../../row_window.h"
#include "ds4_ops.h"
#include "hparams.h"

namespace xrun::ds4 {

class Compressor {
 public:
  // prefix: "blk.N.attn_compressor" or "blk.N.indexer_compressor"; width is
  // the compressed key width (head_dim, or the indexer head width).
  Compressor(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, const std::string& prefix,
             int64_t ratio, int64_t width, bool overlap);

  // Positions pos0 .. pos0+n-1, continuing those appended so far, in two
  // steps: project() adds the products of the attention input x that fill
  // their value and score rows to `from_x` (the layer makes all its
  // projections of x in one call); once those have run, append() completes
  // every block it can.
  void project(int64_t pos0, int64_t n, std::vector<Backend::Product>& from_x);
  void append();

  int64_t ratio() const { return ratio_; }
  int64_t n_blocks() const { return n_blocks_; }
  // The finished blocks' keys, [n_blocks][width].
  Tensor blocks() const { return blocks_.row_range(0, n_blocks_); }
  void reset();

 private:
  const Hparams& hp_;
  Backend& be_;
  Ds4Ops& ops_;
  int64_t ratio_, width_, row_width_;
  bool overlap_;
  Tensor wkv_, wgate_;
  Tensor ape_;   // [ratio][row_width]
  Tensor norm_;  // [width]
  RopeSpec rope_;

  int64_t next_pos_ = 0;  // positions appended so far
  int64_t pos0_ = 0;      // the projected positions' first
  Tensor kv_new_, score_new_;  // their rows, between project() and append()
  RowWindow kv_rows_, score_rows_;  // the rows a future block still pools
  Tensor blocks_;  // [capacity][width], the first n_blocks_ finished
  int64_t n_blocks_ = 0;
};

}  // namespace xrun::ds4
