// deepseek4's own operations on the CUDA backend: the CPU versions' shape
// checks (ds4_ops.h), then kernel launches of cuda/ds4_kernels.h on the
// backend's compute stream. Nothing here waits for the device or reads device
// memory on the host: the indexer's choice stays on the GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../../cuda_backend.h"
#include "ds4_kernels.h"
#include "ds4_ops.h"
#include "quant_matmul.h"
#include "runtime_ops.h"
#include "xpack/xpack.h"

namespace xrun::ds4 {

namespace {

namespace k = xpack::rt::ds4;

void check(bool ok, const char* what) {
  if (!ok) throw ModelError(std::string("backend: ") + what);
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw ModelError(std::string("CUDA: deepseek4 ") + what + ": " + cudaGetErrorName(e) + " (" +
                     cudaGetErrorString(e) + ")");
  }
}

bool is_f32(const Tensor& t) { return t.type == XPACK_TYPE_F32; }

void check_stream(const HcShape& s, const Tensor& stream, const Tensor& mixes, int64_t mix_width, const Tensor& out) {
  check(is_f32(stream) && is_f32(mixes) && is_f32(out) && stream.width() == s.hc * s.n_embd &&
            mixes.width() == mix_width && mixes.rows() == stream.rows() && out.width() == s.n_embd &&
            out.rows() == stream.rows(),
        "hyper-connection shapes disagree");
  check(s.hc >= 1 && s.hc <= k::kMaxHc, "hyper-connections: the CUDA kernels take at most 8 copies");
}

class CudaDs4Ops final : public Ds4Ops {
 public:
  explicit CudaDs4Ops(CudaBackend& be) : be_(be) {}

  void hc_pre(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale, const Tensor& stream,
              const Tensor& input, const Tensor& post, const Tensor& comb, const Tensor* norm) override {
    const OpProfile::Scope timed(be_.profile(), "ds4 hc_pre");
    const int64_t hc = s.hc, md = (2 + hc) * hc, n = stream.rows();
    check_stream(s, stream, mixes, md, input);
    check(base.numel() == md && scale.numel() == 3 && post.numel() == n * hc && comb.numel() == n * hc * hc,
          "hc_pre shapes disagree");
    const k::HcNorm folded = fold(s, n, norm);
    check_cuda(k::hc_pre(mixes.f32(), base.f32(), scale.f32(), stream.f32(), n, int(hc), s.n_embd,
                         int(s.sinkhorn_iters), s.eps, s.rms_eps, input.f32(), post.f32(), comb.f32(),
                         norm ? &folded : nullptr, cs()),
               "hc_pre");
  }

  void hc_post(const HcShape& s, const Tensor& output, const Tensor& residual, const Tensor& post, const Tensor& comb,
               const Tensor& stream) override {
    const OpProfile::Scope timed(be_.profile(), "ds4 hc_post");
    const int64_t hc = s.hc, d = s.n_embd, width = hc * d, n = output.rows();
    check(output.width() == d && residual.width() == width && stream.width() == width && residual.rows() == n &&
              stream.rows() == n && post.numel() == n * hc && comb.numel() == n * hc * hc,
          "hc_post shapes disagree");
    check_cuda(k::hc_post(output.f32(), residual.f32(), post.f32(), comb.f32(), n, int(hc), d, stream.f32(), cs()),
               "hc_post");
  }

  void hc_head(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale, const Tensor& stream,
               const Tensor& out, const Tensor* norm) override {
    const OpProfile::Scope timed(be_.profile(), "ds4 hc_head");
    check_stream(s, stream, mixes, s.hc, out);
    check(base.numel() == s.hc && scale.numel() == 1, "hc_head shapes disagree");
    const k::HcNorm folded = fold(s, stream.rows(), norm);
    check_cuda(k::hc_head(mixes.f32(), base.f32(), scale.f32(), stream.f32(), stream.rows(), int(s.hc), s.n_embd, s.eps,
                          s.rms_eps, out.f32(), norm ? &folded : nullptr, cs()),
               "hc_head");
  }

  void compress_pool(const Tensor& kv, const Tensor& score, int64_t rows_first, int64_t first_block, int64_t ratio,
                     bool overlap, const Tensor& out) override {
    const OpProfile::Scope timed(be_.profile(), "ds4 compress_pool");
    const int64_t width = out.width(), row_width = overlap ? 2 * width : width, n_out = out.rows();
    check(is_f32(kv) && is_f32(score) && is_f32(out) && kv.width() == row_width && score.width() == row_width &&
              kv.rows() == score.rows() && ratio > 0,
          "compress_pool shapes disagree");
    if (n_out == 0) return;
    // The positions the blocks pool (from before the sequence: nothing), all kept?
    const int64_t lo = std::max<int64_t>(0, (first_block - (overlap ? 1 : 0)) * ratio);
    const int64_t hi = (first_block + n_out) * ratio;  // exclusive
    check(lo >= rows_first && hi - rows_first <= kv.rows(), "compress_pool: a pooled row is no longer kept");
    check_cuda(k::compress_pool(kv.f32(), score.f32(), rows_first, first_block, n_out, width, ratio, overlap,
                                out.f32(), cs()),
               "compress_pool");
  }

  void indexer_select(const Tensor& q, const Tensor& w, const Tensor& keys, int64_t n_head, int64_t pos0,
                      int64_t ratio, const Tensor& chosen) override {
    const OpProfile::Scope timed(be_.profile(), "ds4 indexer_select");
    const int64_t id = keys.width(), top_k = chosen.width(), n = q.rows(), n_blocks = keys.rows();
    check(is_f32(q) && is_f32(w) && is_f32(keys) && q.width() == n_head * id && w.width() == n_head &&
              w.rows() == n && chosen.rows() == n && chosen.type == XPACK_TYPE_I32 && ratio > 0,
          "indexer_select shapes disagree");
    Tensor scores;
    if (n_blocks > top_k) scores = be_.empty(XPACK_TYPE_F32, n_blocks, n);  // some query may have to choose
    check_cuda(k::indexer_select(q.f32(), w.f32(), keys.f32(), n_blocks, n, n_head, id, pos0, ratio, top_k,
                                 scores.f32(), chosen.i32(), cs()),
               "indexer_select");
  }

  void attention(const Tensor& q, const Tensor& raw, int64_t raw_first, int64_t window, const Tensor* blocks,
                 int64_t ratio, const Tensor* chosen, const Tensor& sinks, int64_t pos0, const Tensor& out) override {
    const OpProfile::Scope timed(be_.profile(), "ds4 attention");
    const int64_t hd = raw.width(), nh = sinks.numel(), n = q.rows();
    check(is_f32(q) && is_f32(raw) && is_f32(sinks) && is_f32(out) && q.width() == nh * hd &&
              out.width() == q.width() && out.rows() == n && (!blocks || (is_f32(*blocks) && blocks->width() == hd)) &&
              (!chosen || (chosen->type == XPACK_TYPE_I32 && chosen->rows() == n && blocks)) && window > 0 &&
              ratio > 0,
          "deepseek4 attention shapes disagree");
    if (n == 0) return;
    check(pos0 + n - 1 - raw_first < raw.rows() && pos0 >= raw_first, "deepseek4 attention: the query's own key is missing");
    k::AttentionArgs a;
    a.q = q.f32();
    a.raw = raw.f32();
    a.raw_rows = raw.rows();
    a.raw_first = raw_first;
    a.window = window;
    if (blocks) {
      a.blocks = blocks->f32();
      a.n_blocks = blocks->rows();
      a.ratio = ratio;
    }
    if (chosen) {
      a.chosen = chosen->i32();
      a.n_chosen = chosen->width();
    }
    a.sinks = sinks.f32();
    a.n_head = nh;
    a.head_dim = hd;
    a.pos0 = pos0;
    a.n = n;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.out = out.f32();
    if (n >= kBatchedTokens && k::attention_gather_fits(a)) return attention_batched(a);
    Tensor scratch, part;
    if (!k::attention_fits_smem(a)) scratch = be_.alloc(XPACK_TYPE_F32, k::attention_max_keys(a), n * nh);
    if (const int splits = k::attention_splits(a); splits > 1) part = be_.empty(XPACK_TYPE_F32, (hd + 2) * splits, n * nh);
    check_cuda(k::attention(a, scratch.data ? scratch.f32() : nullptr, part.data ? part.f32() : nullptr, cs()),
               "attention");
  }

 private:
  // A prompt's attention as products: per chunk of queries, each query's keys
  // gathered into one matrix (its window, then its blocks), scores = q K^T and
  // out = softmax(scores) K as cuBLAS products batched over the queries. The
  // heads of a query share its keys, so a key is read once per query, where
  // attention_kernel's block per (query, head) read it once per head: 300 of a
  // 4096-token prompt's 650 ms (6 layers, H200) went to that kernel.
  void attention_batched(const k::AttentionArgs& a) {
    const int64_t K = k::attention_max_keys(a), H = a.n_head, hd = a.head_dim;
    const int64_t chunk = std::clamp<int64_t>(kChunkFloats / (K * (hd + H)), 1, kMaxChunkTokens);
    const int64_t m0 = std::min(a.n, chunk);
    const Tensor keys = be_.empty(XPACK_TYPE_F32, hd, m0 * K), scores = be_.empty(XPACK_TYPE_F32, K, m0 * H);
    const Tensor counts = be_.empty(XPACK_TYPE_I32, 1, m0);
    namespace xk = xpack::kernels;
    xk::Context* ctx = be_.kernels_context();
    for (int64_t t0 = 0; t0 < a.n; t0 += m0) {
      const int64_t m = std::min(m0, a.n - t0);
      check_cuda(k::attention_gather(a, t0, m, keys.f32(), counts.i32(), cs()), "attention (gather)");
      check_gemm(xk::float_gemm(ctx, false, true, H, K, hd, a.scale, a.q + t0 * H * hd, hd, H * hd, keys.f32(), hd,
                                K * hd, 0.0f, scores.f32(), K, H * K, int(m), cs()),
                 "attention scores");
      check_cuda(xpack::rt::masked_softmax_rows(scores.f32(), K, m * H, H, counts.i32(), 0, a.sinks, cs()),
                 "attention softmax");
      check_gemm(xk::float_gemm(ctx, false, false, H, hd, K, 1.0f, scores.f32(), K, H * K, keys.f32(), hd, K * hd,
                                0.0f, a.out + t0 * H * hd, hd, H * hd, int(m), cs()),
                 "attention values");
    }
  }

  static void check_gemm(int status, const char* what) {
    if (status != xpack::kernels::kOk)
      throw ModelError(std::string("CUDA: deepseek4 ") + what + ": " + xpack::kernels::status_name(status));
  }

  // Prompts of this many tokens take attention_batched(); fewer (decode) the
  // one-kernel path, one launch where the products take four per chunk.
  static constexpr int64_t kBatchedTokens = 16;
  // A chunk's gathered keys and scores: at most 256 MiB, and 256 queries.
  static constexpr int64_t kChunkFloats = int64_t(64) << 20;
  static constexpr int64_t kMaxChunkTokens = 256;

  cudaStream_t cs() { return static_cast<cudaStream_t>(be_.stream()); }

  // The buffers of a norm folded into hc_pre or hc_head for n tokens (k::HcNorm;
  // none without a norm). Kept from call to call: the counters are zero after
  // every launch, so only a larger batch than any before allocates (and zeroes) anew.
  k::HcNorm fold(const HcShape& s, int64_t n, const Tensor* norm) {
    if (!norm) return {};
    check(is_f32(*norm) && norm->numel() == s.n_embd, "hyper-connection norm is not one F32 row");
    const int64_t blocks = k::hc_norm_blocks(s.n_embd);
    if (n > norm_tokens_ || blocks > norm_blocks_) {
      norm_tokens_ = std::max<int64_t>({n, norm_tokens_, 64});
      norm_blocks_ = std::max(blocks, norm_blocks_);
      norm_partials_ = be_.empty(XPACK_TYPE_F32, 2 * norm_blocks_, norm_tokens_);  // doubles
      norm_counters_ = be_.alloc(XPACK_TYPE_I32, norm_tokens_, 1);
    }
    return {norm->f32(), static_cast<double*>(norm_partials_.data), static_cast<unsigned*>(norm_counters_.data)};
  }

  CudaBackend& be_;
  // hc_pre's folded norm: per token its blocks' sums of squares and a count
  // of the blocks done (k::HcNorm).
  Tensor norm_partials_, norm_counters_;
  int64_t norm_tokens_ = 0, norm_blocks_ = 0;
};

}  // namespace

// ds4_ops.cpp's hook for the CUDA backend (nullptr for any other backend).
std::unique_ptr<Ds4Ops> make_cuda_ds4_ops(Backend& be) {
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) return std::make_unique<CudaDs4Ops>(*cuda);
  return nullptr;
}

}  // namespace xrun::ds4
