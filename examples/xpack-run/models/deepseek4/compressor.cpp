// KV compression (see compressor.h for the scheme).
#include "compressor.h"

#include <algorithm>
#include <vector>

#include "xpack/xpack.h"

namespace xrun::ds4 {

Compressor::Compressor(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, const std::string& prefix,
                       int64_t ratio, int64_t width, bool overlap)
    : hp_(hp),
      be_(be),
      ops_(ops),
      ratio_(ratio),
      width_(width),
      row_width_(overlap ? 2 * width : width),
      overlap_(overlap),
      kv_rows_(row_width_),
      score_rows_(row_width_) {
  wkv_ = be.weight(w.get(prefix + "_kv.weight", {hp.n_embd, row_width_}));
  wgate_ = be.weight(w.get(prefix + "_gate.weight", {hp.n_embd, row_width_}));
  ape_ = float_weight(be, w.get(prefix + "_ape.weight", {row_width_, ratio_}));
  norm_ = float_weight(be, w.get(prefix + "_norm.weight", {width_}));
  rope_.angles = hp.rope_compressed;
  rope_.head_dim = width_;
  rope_.tail = true;
  reset();
}

void Compressor::reset() {
  next_pos_ = 0;
  kv_new_ = score_new_ = Tensor{};
  kv_rows_.reset(be_);
  score_rows_.reset(be_);
  blocks_ = be_.alloc(XPACK_TYPE_F32, width_, 0);
  n_blocks_ = 0;
}

void Compressor::project(int64_t pos0, int64_t n, std::vector<Backend::Product>& from_x) {
  if (pos0 != next_pos_ || kv_new_.data) {
    throw ModelError("compressor: position " + std::to_string(pos0) + " does not continue the sequence at " +
                     std::to_string(next_pos_) + (kv_new_.data ? " (the previous positions were not appended)" : ""));
  }
  // Computed in their places in the kept rows.
  pos0_ = pos0;
  kv_new_ = kv_rows_.append_rows(be_, n);
  score_new_ = score_rows_.append_rows(be_, n);
  from_x.push_back({&wkv_, &kv_new_});
  from_x.push_back({&wgate_, &score_new_});
}

void Compressor::append() {
  const int64_t pos0 = pos0_, n = score_new_.rows();
  const Tensor score = score_new_;
  kv_new_ = score_new_ = Tensor{};
  // The learned absolute position bias depends on the offset inside a block:
  // for positions within one block (a decode step) a row range of it.
  if (pos0 % ratio_ + n <= ratio_) {
    be_.add(score, ape_.row_range(pos0 % ratio_, n), score);
  } else {
    std::vector<int32_t> offsets(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) offsets[size_t(t)] = static_cast<int32_t>((pos0 + t) % ratio_);
    const Tensor ape = be_.empty(XPACK_TYPE_F32, row_width_, n);
    be_.get_rows(ape_, be_.upload(XPACK_TYPE_I32, offsets.data(), 1, n), ape);
    be_.add(score, ape, score);
  }
  next_pos_ += n;

  // Every block whose last position has now been seen is final.
  const int64_t n_new = next_pos_ / ratio_ - n_blocks_;
  if (n_new > 0) {
    const Tensor pooled = be_.empty(XPACK_TYPE_F32, width_, n_new);
    ops_.compress_pool(kv_rows_.view(), score_rows_.view(), kv_rows_.first(), n_blocks_, ratio_, overlap_, pooled);
    reserve_rows(be_, blocks_, n_blocks_ + n_new);
    const Tensor keys = blocks_.row_range(n_blocks_, n_new);
    be_.rms_norm(pooled, &norm_, hp_.rms_eps, keys);
    // Rotated at each block's first position.
    be_.rope(keys, rope_, n_blocks_ * ratio_, ratio_);
    n_blocks_ += n_new;
  }

  // Keep the rows the next block will pool: its own and, when overlapping,
  // the previous block's.
  const int64_t keep_from = std::max<int64_t>(0, (n_blocks_ - (overlap_ ? 1 : 0)) * ratio_);
  kv_rows_.drop_before(keep_from);
  score_rows_.drop_before(keep_from);
}

}  // namespace xrun::ds4
