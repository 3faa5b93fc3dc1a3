// KV compression (see compressor.h for the scheme).
#include "compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <functional>  // ops.h uses std::function before including it

#include "../../ops.h"
#include "rope.h"

namespace xrun::ds4 {

Compressor::Compressor(const Weights& w, const Hparams& hp, const std::string& prefix,
                       int64_t ratio, int64_t width, bool overlap)
    : hp_(hp), ratio_(ratio), width_(width), row_width_(overlap ? 2 * width : width), overlap_(overlap) {
  wkv_ = &w.get(prefix + "_kv.weight", {hp.n_embd, row_width_});
  wgate_ = &w.get(prefix + "_gate.weight", {hp.n_embd, row_width_});
  ape_ = to_float(w.get(prefix + "_ape.weight", {row_width_, ratio_}));
  norm_ = to_float(w.get(prefix + "_norm.weight", {width_}));
}

void Compressor::reset() {
  next_pos_ = 0;
  rows_pos0_ = 0;
  kv_rows_.clear();
  score_rows_.clear();
  blocks_.clear();
}

const float* Compressor::kv_row(int64_t pos) const {
  return kv_rows_.data() + (pos - rows_pos0_) * row_width_;
}

const float* Compressor::score_row(int64_t pos) const {
  return score_rows_.data() + (pos - rows_pos0_) * row_width_;
}

void Compressor::append(const float* x, int n, int64_t pos0) {
  if (pos0 != next_pos_) {
    throw ModelError("compressor: position " + std::to_string(pos0) + " does not continue the sequence at " +
                     std::to_string(next_pos_));
  }
  const size_t old = kv_rows_.size();
  kv_rows_.resize(old + static_cast<size_t>(n * row_width_));
  score_rows_.resize(old + static_cast<size_t>(n * row_width_));
  matmul(*wkv_, x, n, kv_rows_.data() + old);
  matmul(*wgate_, x, n, score_rows_.data() + old);
  // The learned absolute position bias depends on the offset inside a block.
  for (int t = 0; t < n; ++t) {
    const float* ape = ape_.data() + ((pos0 + t) % ratio_) * row_width_;
    float* s = score_rows_.data() + old + static_cast<size_t>(t * row_width_);
    for (int64_t c = 0; c < row_width_; ++c) s[c] += ape[c];
  }
  next_pos_ += n;

  while ((n_blocks() + 1) * ratio_ <= next_pos_) compress_block(n_blocks());

  // Keep the rows the next block will pool: its own and, when overlapping,
  // the previous block's.
  const int64_t keep_from = std::max<int64_t>(0, (n_blocks() - (overlap_ ? 1 : 0)) * ratio_);
  if (keep_from > rows_pos0_) {
    const size_t drop = static_cast<size_t>((keep_from - rows_pos0_) * row_width_);
    kv_rows_.erase(kv_rows_.begin(), kv_rows_.begin() + static_cast<std::ptrdiff_t>(drop));
    score_rows_.erase(score_rows_.begin(), score_rows_.begin() + static_cast<std::ptrdiff_t>(drop));
    rows_pos0_ = keep_from;
  }
}

void Compressor::compress_block(int64_t b) {
  const int64_t n_entries = overlap_ ? 2 * ratio_ : ratio_;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> values(static_cast<size_t>(n_entries)), scores(static_cast<size_t>(n_entries));
  std::vector<float> pooled(static_cast<size_t>(width_));

  for (int64_t c = 0; c < width_; ++c) {
    // Gather this channel's entries: [previous block, first half | own block, second half]
    // when overlapping, else just the own block.
    for (int64_t j = 0; j < n_entries; ++j) {
      int64_t pos, col;
      if (overlap_ && j < ratio_) {
        pos = (b - 1) * ratio_ + j;
        col = c;
      } else {
        pos = b * ratio_ + (overlap_ ? j - ratio_ : j);
        col = overlap_ ? width_ + c : c;
      }
      if (pos < 0) {  // before the sequence: contributes nothing
        values[j] = 0.0f;
        scores[j] = neg_inf;
      } else {
        values[j] = kv_row(pos)[col];
        scores[j] = score_row(pos)[col];
      }
    }
    softmax_inplace(scores.data(), n_entries);
    double sum = 0.0;
    for (int64_t j = 0; j < n_entries; ++j) sum += static_cast<double>(values[j] * scores[j]);
    pooled[c] = static_cast<float>(sum);
  }

  const size_t at = blocks_.size();
  blocks_.resize(at + static_cast<size_t>(width_));
  float* key = blocks_.data() + at;
  rms_norm(pooled.data(), norm_.data(), width_, hp_.rms_eps, key);
  std::vector<float> cache(static_cast<size_t>(hp_.rope_compressed.n_dims));
  rope_cache(hp_.rope_compressed, b * ratio_, /*inverse=*/false, cache.data());
  rope_apply(cache.data(), hp_.rope_compressed.n_dims, key + width_ - hp_.rope_compressed.n_dims);
}

}  // namespace xrun::ds4
