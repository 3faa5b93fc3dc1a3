// The operations only deepseek4 uses, on backend tensors: hyper-connection
// mixing (Sinkhorn), KV-block pooling of the compressor, the lightning
// indexer's block choice and the attention core over a sliding window plus
// compressed blocks with per-head sinks. Each backend gets its implementation
// beside the CPU one (ds4_ops_cpu.h); the graph files only see this interface.
#pragma once

#include <cstdint>
#include <memory>

#include "../../backend.h"

namespace xrun::ds4 {

struct HcShape {
  int64_t hc = 0;      // copies of the residual stream
  int64_t n_embd = 0;
  int64_t sinkhorn_iters = 0;
  float eps = 0.0f;
  float rms_eps = 0.0f;  // the norm of the stream whose product the mixes are
};

class Ds4Ops {
 public:
  virtual ~Ds4Ops() = default;

  // From mixes [n][(2 + hc) * hc] = fn . stream, base and scale [3]: with m =
  // mixes * r, r the scale rms_norm(stream, rms_eps) would apply (so m = fn .
  // rms_norm(stream), the norm folded into the mixes rather than written out),
  // pre = sigmoid(m * scale0 + base) + eps, post = 2 sigmoid(m * scale1 + base),
  // comb = Sinkhorn(softmax(m * scale2 + base)); writes post [n][hc], comb
  // [n][hc * hc] (src-major) and input [n][n_embd] = sum_h pre[h] * copy h of
  // stream, or with `norm` (F32 [n_embd]) rms_norm(that sum, rms_eps) * norm:
  // the sub-layer's own norm, folded in (as Backend::rms_norm computes it).
  virtual void hc_pre(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale,
                      const Tensor& stream, const Tensor& input, const Tensor& post, const Tensor& comb,
                      const Tensor* norm = nullptr) = 0;
  // stream copy dst = post[dst] * output + sum_src comb[src][dst] * residual copy
  // src; stream may be residual (in place).
  virtual void hc_post(const HcShape& s, const Tensor& output, const Tensor& residual, const Tensor& post,
                       const Tensor& comb, const Tensor& stream) = 0;
  // The head's collapse: out = sum_h (sigmoid(m[h] * scale0 + base[h]) + eps) * copy h,
  // m = mixes * r as in hc_pre; with `norm`, through rms_norm as in hc_pre (output_norm).
  virtual void hc_head(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale,
                       const Tensor& stream, const Tensor& out, const Tensor* norm = nullptr) = 0;

  // Pools blocks first_block .. first_block + out.rows() - 1 of `ratio`
  // positions: per channel a softmax over the score entries weights the value
  // entries (sum in double). kv, score: [rows][row width] of positions
  // rows_first ..; overlapping rows are two halves wide, block b then pooling
  // the first halves of block b-1's positions and the second halves of its own.
  virtual void compress_pool(const Tensor& kv, const Tensor& score, int64_t rows_first, int64_t first_block,
                             int64_t ratio, bool overlap, const Tensor& out) = 0;

  // Per query t at position pos0 + t: the compressed blocks it attends to,
  // ascending, -1 padded to top_k: all visible ones if at most top_k, else the
  // top_k of sum_h w[t][h] * relu(q[t][h] . key[b]) (ties to the lower block).
  // A block is visible once its last position is at or before the query.
  virtual void indexer_select(const Tensor& q, const Tensor& w, const Tensor& keys, int64_t n_head, int64_t pos0,
                              int64_t ratio, const Tensor& chosen) = 0;

  // Attention of q [n][n_head * D] at positions pos0 + t over one shared K=V
  // head: the raw keys of positions (pos - window, pos] (raw: rows of
  // positions raw_first ..), then compressed blocks: chosen (I32 [n][m], -1
  // padded) when given, else every visible block of `blocks` (ratio `ratio`),
  // or none when blocks is null. Softmax with the per-head sink logit
  // (sinks [n_head]) taking mass without a value, scaled by 1/sqrt(D).
  virtual void attention(const Tensor& q, const Tensor& raw, int64_t raw_first, int64_t window,
                         const Tensor* blocks, int64_t ratio, const Tensor* chosen, const Tensor& sinks,
                         int64_t pos0, const Tensor& out) = 0;
};

// The implementation for `be` (throws ModelError for a backend without one).
std::unique_ptr<Ds4Ops> make_ds4_ops(Backend& be);

}  // namespace xrun::ds4
