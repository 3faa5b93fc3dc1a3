// DeepSeek-V4 attention (see attention.h).
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <functional>  // ops.h uses std::function before including it

#include "../../ops.h"
#include "rope.h"

namespace xrun::ds4 {

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Rotates the last n_dims of each of `n_heads` rows of width `width`.
void rope_heads(const RopeParams& p, int64_t pos, bool inverse, float* rows, int64_t n_heads, int64_t width) {
  std::vector<float> cache(static_cast<size_t>(p.n_dims));
  rope_cache(p, pos, inverse, cache.data());
  for (int64_t h = 0; h < n_heads; ++h) rope_apply(cache.data(), p.n_dims, rows + h * width + width - p.n_dims);
}

}  // namespace

Attention::Attention(const Weights& w, const Hparams& hp, int64_t layer)
    : hp_(hp),
      layer_(layer),
      kind_(hp.attn_kind(layer)),
      rope_(kind_ == AttnKind::kSlidingOnly ? hp.rope_raw : hp.rope_compressed) {
  const int64_t d = hp.n_embd, hd = hp.head_dim;
  wq_a_ = &w.get(blk(layer, "attn_q_a.weight"), {d, hp.q_lora_rank});
  q_a_norm_ = to_float(w.get(blk(layer, "attn_q_a_norm.weight"), {hp.q_lora_rank}));
  wq_b_ = &w.get(blk(layer, "attn_q_b.weight"), {hp.q_lora_rank, hp.n_head * hd});
  wkv_ = &w.get(blk(layer, "attn_kv.weight"), {d, hd});
  kv_norm_ = to_float(w.get(blk(layer, "attn_kv_a_norm.weight"), {hd}));
  sinks_ = to_float(w.get(blk(layer, "attn_sinks.weight"), {hp.n_head}));
  const int64_t group_dim = hp.n_head / hp.o_groups * hd;
  wo_a_ = &w.get(blk(layer, "attn_output_a.weight"), {group_dim, hp.o_lora_rank * hp.o_groups});
  wo_b_ = &w.get(blk(layer, "attn_output_b.weight"), {hp.o_groups * hp.o_lora_rank, d});

  const int64_t ratio = hp.compress_ratio[static_cast<size_t>(layer)];
  if (kind_ == AttnKind::kCsa) {
    compressor_ = std::make_unique<Compressor>(w, hp, blk(layer, "attn_compressor"), ratio, hd, true);
    idx_compressor_ =
        std::make_unique<Compressor>(w, hp, blk(layer, "indexer_compressor"), ratio, hp.idx_head_dim, true);
    idx_q_b_ = &w.get(blk(layer, "indexer.attn_q_b.weight"), {hp.q_lora_rank, hp.idx_n_head * hp.idx_head_dim});
    idx_proj_ = &w.get(blk(layer, "indexer.proj.weight"), {d, hp.idx_n_head});
  } else if (kind_ == AttnKind::kHca) {
    compressor_ = std::make_unique<Compressor>(w, hp, blk(layer, "attn_compressor"), ratio, hd, false);
  }
}

void Attention::reset() {
  raw_keys_.clear();
  raw_pos0_ = 0;
  next_pos_ = 0;
  if (compressor_) compressor_->reset();
  if (idx_compressor_) idx_compressor_->reset();
}

void Attention::forward(const float* x, int n, int64_t pos0, float* out) {
  if (pos0 != next_pos_) {
    throw ModelError("attention: position " + std::to_string(pos0) + " does not continue the sequence at " +
                     std::to_string(next_pos_));
  }
  const int64_t hd = hp_.head_dim, nh = hp_.n_head, ql = hp_.q_lora_rank;

  // --- queries: low-rank projection, per-head RMS norm, rotated tail ---
  std::vector<float> qr(static_cast<size_t>(n * ql));
  matmul(*wq_a_, x, n, qr.data());
  for (int t = 0; t < n; ++t) rms_norm(qr.data() + t * ql, q_a_norm_.data(), ql, hp_.rms_eps, qr.data() + t * ql);
  std::vector<float> q(static_cast<size_t>(n * nh * hd));
  matmul(*wq_b_, qr.data(), n, q.data());
  for (int t = 0; t < n; ++t) {
    float* qt = q.data() + t * nh * hd;
    for (int64_t h = 0; h < nh; ++h) rms_norm(qt + h * hd, nullptr, hd, hp_.rms_eps, qt + h * hd);
    rope_heads(rope_, pos0 + t, false, qt, nh, hd);
  }

  // --- the shared key/value vector of each new position ---
  const size_t old = raw_keys_.size();
  raw_keys_.resize(old + static_cast<size_t>(n * hd));
  float* kv = raw_keys_.data() + old;
  matmul(*wkv_, x, n, kv);
  for (int t = 0; t < n; ++t) {
    rms_norm(kv + t * hd, kv_norm_.data(), hd, hp_.rms_eps, kv + t * hd);
    rope_heads(rope_, pos0 + t, false, kv + t * hd, 1, hd);
  }
  next_pos_ += n;

  // --- compressed keys: every block completed by these positions ---
  if (compressor_) compressor_->append(x, n, pos0);
  if (idx_compressor_) idx_compressor_->append(x, n, pos0);

  // --- lightning indexer queries and per-head weights (CSA) ---
  std::vector<float> idx_q, idx_w;
  if (kind_ == AttnKind::kCsa) {
    const int64_t ih = hp_.idx_n_head, id = hp_.idx_head_dim;
    idx_q.resize(static_cast<size_t>(n * ih * id));
    matmul(*idx_q_b_, qr.data(), n, idx_q.data());
    for (int t = 0; t < n; ++t) rope_heads(hp_.rope_compressed, pos0 + t, false, idx_q.data() + t * ih * id, ih, id);
    idx_w.resize(static_cast<size_t>(n * ih));
    matmul(*idx_proj_, x, n, idx_w.data());
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(id * ih));
    for (float& v : idx_w) v *= w_scale;
  }

  // --- attention of every query over its visible keys ---
  std::vector<float> heads(static_cast<size_t>(n * nh * hd));
  parallel_for(n, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> blocks;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = pos0 + t;
      blocks.clear();
      if (kind_ != AttnKind::kSlidingOnly) {
        // A block is visible once its last position is at or before the query.
        const int64_t n_visible = std::min((pos + 1) / compressor_->ratio(), compressor_->n_blocks());
        if (kind_ == AttnKind::kCsa) {
          select_blocks(idx_q.data() + t * hp_.idx_n_head * hp_.idx_head_dim,
                        idx_w.data() + t * hp_.idx_n_head, n_visible, blocks);
        } else {
          blocks.resize(static_cast<size_t>(n_visible));
          std::iota(blocks.begin(), blocks.end(), int64_t{0});
        }
      }
      attend(q.data() + t * nh * hd, pos, blocks, heads.data() + t * nh * hd);
    }
  });

  project_output(heads.data(), n, out);

  // Raw keys older than the window of the next query are never read again.
  const int64_t keep_from = next_pos_ - hp_.n_swa + 1;
  if (keep_from > raw_pos0_) {
    const size_t drop = static_cast<size_t>((keep_from - raw_pos0_) * hd);
    raw_keys_.erase(raw_keys_.begin(), raw_keys_.begin() + static_cast<std::ptrdiff_t>(drop));
    raw_pos0_ = keep_from;
  }
}

void Attention::select_blocks(const float* idx_q, const float* idx_w, int64_t n_visible,
                              std::vector<int64_t>& chosen) const {
  chosen.clear();
  if (n_visible <= hp_.idx_top_k) {
    for (int64_t b = 0; b < n_visible; ++b) chosen.push_back(b);
    return;
  }
  // score(b) = sum_h w_h * relu(q_h . k_b): the indexer's cheap relevance.
  const int64_t ih = hp_.idx_n_head, id = hp_.idx_head_dim;
  std::vector<float> score(static_cast<size_t>(n_visible));
  for (int64_t b = 0; b < n_visible; ++b) {
    const float* k = idx_compressor_->block(b);
    double s = 0.0;
    for (int64_t h = 0; h < ih; ++h) s += static_cast<double>(std::max(0.0f, dot(idx_q + h * id, k, id)) * idx_w[h]);
    score[b] = static_cast<float>(s);
  }
  std::vector<int64_t> order(static_cast<size_t>(n_visible));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + hp_.idx_top_k, order.end(),
                    [&](int64_t a, int64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
  chosen.assign(order.begin(), order.begin() + hp_.idx_top_k);
  std::sort(chosen.begin(), chosen.end());
}

void Attention::attend(const float* q, int64_t pos, const std::vector<int64_t>& blocks, float* out) const {
  const int64_t hd = hp_.head_dim, nh = hp_.n_head;
  const int64_t raw_lo = std::max(raw_pos0_, pos - hp_.n_swa + 1);
  const int64_t n_raw = pos - raw_lo + 1;
  const int64_t n_keys = n_raw + static_cast<int64_t>(blocks.size());
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  std::vector<const float*> keys(static_cast<size_t>(n_keys));
  for (int64_t j = 0; j < n_raw; ++j) keys[j] = raw_keys_.data() + (raw_lo - raw_pos0_ + j) * hd;
  for (size_t j = 0; j < blocks.size(); ++j) keys[n_raw + j] = compressor_->block(blocks[j]);

  std::vector<float> p(static_cast<size_t>(n_keys));
  std::vector<float> cache(static_cast<size_t>(rope_.n_dims));
  rope_cache(rope_, pos, /*inverse=*/true, cache.data());
  for (int64_t h = 0; h < nh; ++h) {
    const float* qh = q + h * hd;
    // Softmax over the keys plus the sink logit, which only absorbs mass.
    const float sink = sinks_[h];
    float mx = sink;
    for (int64_t j = 0; j < n_keys; ++j) {
      p[j] = dot(qh, keys[j], hd) * kq_scale;
      mx = std::max(mx, p[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n_keys; ++j) {
      p[j] = std::exp(p[j] - mx);
      sum += p[j];
    }
    sum += std::exp(sink - mx);
    const float inv = static_cast<float>(1.0 / sum);

    float* oh = out + h * hd;
    std::fill(oh, oh + hd, 0.0f);
    for (int64_t j = 0; j < n_keys; ++j) {
      const float pj = p[j] * inv;
      const float* v = keys[j];
      for (int64_t i = 0; i < hd; ++i) oh[i] += pj * v[i];
    }
    // Values carry their keys' rotation; undo it at the query position.
    rope_apply(cache.data(), rope_.n_dims, oh + hd - rope_.n_dims);
  }
}

void Attention::project_output(const float* heads, int n, float* out) const {
  const int64_t hd = hp_.head_dim, nh = hp_.n_head, groups = hp_.o_groups, rank = hp_.o_lora_rank;
  const int64_t group_dim = nh / groups * hd;
  std::vector<float> group_in(static_cast<size_t>(n * group_dim)), group_out(static_cast<size_t>(n * rank));
  std::vector<float> low(static_cast<size_t>(n * groups * rank));
  const size_t rb = row_bytes(wo_a_->type, group_dim);
  for (int64_t g = 0; g < groups; ++g) {
    // Group g owns rows [g*rank, (g+1)*rank) of attn_output_a.
    WeightTensor slice = *wo_a_;
    slice.ne[1] = rank;
    slice.data = static_cast<const uint8_t*>(wo_a_->data) + static_cast<size_t>(g * rank) * rb;
    slice.nbytes = static_cast<size_t>(rank) * rb;
    for (int t = 0; t < n; ++t) {
      std::copy_n(heads + t * nh * hd + g * group_dim, group_dim, group_in.data() + t * group_dim);
    }
    matmul(slice, group_in.data(), n, group_out.data());
    for (int t = 0; t < n; ++t) {
      std::copy_n(group_out.data() + t * rank, rank, low.data() + t * groups * rank + g * rank);
    }
  }
  matmul(*wo_b_, low.data(), n, out);
}

}  // namespace xrun::ds4
