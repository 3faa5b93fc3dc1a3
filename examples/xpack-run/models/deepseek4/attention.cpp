// DeepSeek-V4 attention (see attention.h).
#include "attention.h"

#include <cmath>
#include <vector>

#include "xpack/xpack.h"

namespace xrun::ds4 {

namespace {

constexpr uint32_t kF32 = XPACK_TYPE_F32;

RopeSpec tail_rope(const RopeParams& angles, int64_t head_dim) {
  RopeSpec s;
  s.angles = angles;
  s.head_dim = head_dim;
  s.tail = true;
  return s;
}

}  // namespace

Attention::Attention(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, int64_t layer)
    : hp_(hp),
      be_(be),
      ops_(ops),
      kind_(hp.attn_kind(layer)),
      rope_(tail_rope(kind_ == AttnKind::kSlidingOnly ? hp.rope_raw : hp.rope_compressed, hp.head_dim)),
      idx_rope_(tail_rope(hp.rope_compressed, hp.idx_head_dim)),
      raw_keys_(hp.head_dim) {
  const int64_t d = hp.n_embd, hd = hp.head_dim;
  wq_a_ = be.weight(w.get(blk(layer, "attn_q_a.weight"), {d, hp.q_lora_rank}));
  q_a_norm_ = float_weight(be, w.get(blk(layer, "attn_q_a_norm.weight"), {hp.q_lora_rank}));
  wq_b_ = be.weight(w.get(blk(layer, "attn_q_b.weight"), {hp.q_lora_rank, hp.n_head * hd}));
  wkv_ = be.weight(w.get(blk(layer, "attn_kv.weight"), {d, hd}));
  kv_norm_ = float_weight(be, w.get(blk(layer, "attn_kv_a_norm.weight"), {hd}));
  sinks_ = float_weight(be, w.get(blk(layer, "attn_sinks.weight"), {hp.n_head}));
  const int64_t group_dim = hp.n_head / hp.o_groups * hd;
  wo_a_ = be.weight(w.get(blk(layer, "attn_output_a.weight"), {group_dim, hp.o_lora_rank * hp.o_groups}));
  wo_b_ = be.weight(w.get(blk(layer, "attn_output_b.weight"), {hp.o_groups * hp.o_lora_rank, d}));

  const int64_t ratio = hp.compress_ratio[static_cast<size_t>(layer)];
  if (kind_ == AttnKind::kCsa) {
    compressor_ = std::make_unique<Compressor>(w, hp, be, ops, blk(layer, "attn_compressor"), ratio, hd, true);
    idx_compressor_ =
        std::make_unique<Compressor>(w, hp, be, ops, blk(layer, "indexer_compressor"), ratio, hp.idx_head_dim, true);
    idx_q_b_ = be.weight(w.get(blk(layer, "indexer.attn_q_b.weight"), {hp.q_lora_rank, hp.idx_n_head * hp.idx_head_dim}));
    idx_proj_ = be.weight(w.get(blk(layer, "indexer.proj.weight"), {d, hp.idx_n_head}));
  } else if (kind_ == AttnKind::kHca) {
    compressor_ = std::make_unique<Compressor>(w, hp, be, ops, blk(layer, "attn_compressor"), ratio, hd, false);
  }
  reset();
}

void Attention::reset() {
  raw_keys_.reset(be_);
  next_pos_ = 0;
  if (compressor_) compressor_->reset();
  if (idx_compressor_) idx_compressor_->reset();
}

void Attention::forward(const Tensor& x, int64_t pos0, const Tensor& out) {
  if (pos0 != next_pos_) {
    throw ModelError("attention: position " + std::to_string(pos0) + " does not continue the sequence at " +
                     std::to_string(next_pos_));
  }
  const int64_t n = x.rows(), hd = hp_.head_dim, nh = hp_.n_head;
  const bool csa = kind_ == AttnKind::kCsa;
  const int64_t ih = hp_.idx_n_head, id = hp_.idx_head_dim;

  // --- every projection of the input, in one call: the query's low rank, the
  // shared key/value vector of each new position (in its place in the window),
  // the compressors' rows, the indexer's head weights ---
  const Tensor qr = be_.empty(kF32, hp_.q_lora_rank, n);
  const Tensor kv = raw_keys_.append_rows(be_, n);
  const Tensor idx_w = csa ? be_.empty(kF32, ih, n) : Tensor{};
  std::vector<Backend::Product> from_x = {{&wq_a_, &qr}, {&wkv_, &kv}};
  if (compressor_) compressor_->project(pos0, n, from_x);
  if (idx_compressor_) idx_compressor_->project(pos0, n, from_x);
  if (csa) from_x.push_back({&idx_proj_, &idx_w});
  be_.shared_input_matmul(x, from_x);

  // --- queries: normed low rank, up-projection (with the indexer's queries),
  // per-head RMS norm, rotated tail ---
  be_.rms_norm(qr, &q_a_norm_, hp_.rms_eps, qr);
  const Tensor q = be_.empty(kF32, nh * hd, n);
  const Tensor idx_q = csa ? be_.empty(kF32, ih * id, n) : Tensor{};
  std::vector<Backend::Product> from_qr = {{&wq_b_, &q}};
  if (csa) from_qr.push_back({&idx_q_b_, &idx_q});
  be_.shared_input_matmul(qr, from_qr);
  be_.rms_norm_rope(q, nullptr, hp_.rms_eps, rope_, pos0);

  // --- the new keys ---
  be_.rms_norm_rope(kv, &kv_norm_, hp_.rms_eps, rope_, pos0);
  next_pos_ += n;

  // --- compressed keys: every block completed by these positions ---
  if (compressor_) compressor_->append();
  if (idx_compressor_) idx_compressor_->append();

  // --- lightning indexer: the compressed blocks each query attends to (CSA) ---
  Tensor chosen;
  if (csa) {
    be_.rope(idx_q, idx_rope_, pos0);
    be_.scale(idx_w, 1.0f / std::sqrt(static_cast<float>(id * ih)), idx_w);
    chosen = be_.empty(XPACK_TYPE_I32, hp_.idx_top_k, n);  // every entry written (-1 padded)
    ops_.indexer_select(idx_q, idx_w, idx_compressor_->blocks(), ih, pos0, compressor_->ratio(), chosen);
  }

  // --- attention of every query over its visible keys ---
  const Tensor heads = be_.empty(kF32, nh * hd, n);
  const Tensor blocks = compressor_ ? compressor_->blocks() : Tensor{};
  ops_.attention(q, raw_keys_.view(), raw_keys_.first(), hp_.n_swa, compressor_ ? &blocks : nullptr,
                 compressor_ ? compressor_->ratio() : 1, kind_ == AttnKind::kCsa ? &chosen : nullptr, sinks_, pos0,
                 heads);
  // Values carry their keys' rotation; undo it at the query position.
  be_.rope(heads, rope_, pos0, 1, /*inverse=*/true);

  project_output(heads, out);

  // Raw keys older than the window of the next query are never read again.
  raw_keys_.drop_before(next_pos_ - hp_.n_swa + 1);
}

void Attention::project_output(const Tensor& heads, const Tensor& out) const {
  const int64_t n = heads.rows(), groups = hp_.o_groups, rank = hp_.o_lora_rank;
  const int64_t group_dim = hp_.n_head / groups * hp_.head_dim;
  // Head group g of token t is row t * groups + g of these views; group g owns
  // rows [g*rank, (g+1)*rank) of attn_output_a. All groups are one grouped
  // product over the rows in group order (g * n + t): for one token that order
  // is the heads' own, otherwise a gather before and a scatter after.
  const Tensor group_rows = heads.reshaped(group_dim, n * groups);
  const Tensor low = be_.empty(kF32, groups * rank, n);
  const Tensor low_rows = low.reshaped(rank, n * groups);
  std::vector<Backend::GroupedProblem> problems;
  for (int64_t g = 0; g < groups; ++g) problems.push_back({wo_a_.row_range(g * rank, rank), g * n, n});
  if (n == 1) {
    be_.grouped_matmul(problems, group_rows, low_rows);
  } else {
    std::vector<int32_t> rows(static_cast<size_t>(groups * n));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t t = 0; t < n; ++t) rows[size_t(g * n + t)] = static_cast<int32_t>(t * groups + g);
    const Tensor rows_t = be_.upload(XPACK_TYPE_I32, rows.data(), 1, groups * n);
    const Tensor group_in = be_.empty(kF32, group_dim, groups * n), group_out = be_.empty(kF32, rank, groups * n);
    be_.get_rows(group_rows, rows_t, group_in);
    be_.grouped_matmul(problems, group_in, group_out);
    be_.set_rows(group_out, rows_t, low_rows);
  }
  be_.matmul(wo_b_, low, out);
}

}  // namespace xrun::ds4
