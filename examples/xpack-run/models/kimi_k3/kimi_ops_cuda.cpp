// kimi-k3's own operations on the CUDA backend: the CPU versions' shape checks
// (kimi_ops.h), then kernel launches of cuda/kimi_kernels.h (situ: the MoE
// dispatcher's situ_mul; MLA over a prompt: cuBLAS products through
// kernels::float_gemm around one softmax kernel) on the backend's compute
// stream. Nothing here waits for the device or reads device memory on the host:
// the KDA state and the MLA cache stay on the GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "../../cuda_backend.h"
#include "kimi_kernels.h"
#include "kimi_ops.h"
#include "quant_matmul.h"
#include "runtime_ops.h"
#include "xpack/xpack.h"

namespace xrun::kimi_k3 {

namespace {

namespace k = xpack::rt::kimi;

void check(bool ok, const std::string& what) {
  if (!ok) throw ModelError("backend: " + what);
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw ModelError(std::string("CUDA: kimi-k3 ") + what + ": " + cudaGetErrorName(e) + " (" +
                     cudaGetErrorString(e) + ")");
  }
}

void check_kernels(int st, const char* what) {
  if (st != xpack::kernels::kOk)
    throw ModelError(std::string("CUDA: kimi-k3 ") + what + ": " + xpack::kernels::status_name(st));
}

bool is_f32(const Tensor& t) { return t.type == XPACK_TYPE_F32; }

// MLA takes its batched path (cuBLAS products, mla_batched) from this many query
// tokens on: at decode sizes the one-kernel path is one launch against six.
constexpr int64_t kMlaBatchTokens = 16;
// ... and a decode step from this many visible keys on: the kernel's block per
// (query, head) reads every cached latent once per head, the products read them
// twice in all. The kimi ops timing test measures both side by side (H200,
// 2026-12-03, Kimi-K3's 96 heads: kernel / products 68 / 70 us at 512 keys,
// 113 / 70 at 1024, 365 / 87 at 4096).
constexpr int64_t kMlaProductKeys = 512;
std::atomic<int64_t> g_mla_product_keys{kMlaProductKeys};
// The batched path's scores per chunk of query tokens: 64 Mi floats (256 MiB).
constexpr int64_t kScoreBudgetFloats = int64_t(64) << 20;
// A chunk's tokens all score its last token's keys (the later ones zeroed by the
// softmax): over an n-token prompt that is n * chunk / 2 wasted scores per head
// against the n^2 / 2 needed, kept small by this cap.
constexpr int64_t kMlaMaxChunkTokens = 256;

class CudaKimiOps final : public KimiOps {
 public:
  explicit CudaKimiOps(CudaBackend& be) : be_(be) {}

  void situ(const Tensor& g, const Tensor& u, float beta, float linear_beta) override {
    const OpProfile::Scope timed(be_.profile(), "kimi situ");
    check(is_f32(g) && is_f32(u) && g.numel() == u.numel(), "situ shapes disagree");
    check(beta > 0.0f, "situ: beta must be positive");
    const int st = xpack::kernels::situ_mul(g.f32(), u.f32(), g.numel(), beta, linear_beta, g.f32(), cs());
    check_kernels(st, "situ");
  }

  void res_mix(const Tensor& cur, const std::vector<Tensor>& ckpts, const Tensor& score_w, float eps,
               const Tensor& out) override {
    const OpProfile::Scope timed(be_.profile(), "kimi res_mix");
    const int64_t E = cur.width(), n = cur.rows();
    check(is_f32(cur) && is_f32(out) && is_f32(score_w) && out.width() == E && out.rows() == n &&
              score_w.numel() == E,
          "res_mix shapes disagree");
    check(ckpts.size() <= size_t(k::kMaxCkpts),
          "res_mix: the CUDA kernel takes at most " + std::to_string(k::kMaxCkpts) + " checkpoints");
    std::vector<const float*> ptrs;
    for (const Tensor& c : ckpts) {
      check(is_f32(c) && c.width() == E && c.rows() == n, "res_mix checkpoint shapes disagree");
      ptrs.push_back(c.f32());
    }
    check_cuda(k::res_mix(cur.f32(), ptrs.data(), int(ptrs.size()), score_w.f32(), n, E, eps, out.f32(), cs()),
               "res_mix");
  }

  void short_conv_silu(const Tensor& x, const Tensor& weight, const Tensor& state) override {
    const OpProfile::Scope timed(be_.profile(), "kimi short_conv_silu");
    const int64_t D = x.width(), n = x.rows(), d_conv = weight.width(), n_prev = d_conv - 1;
    check(is_f32(x) && is_f32(weight) && is_f32(state) && weight.rows() == D && state.width() == D &&
              state.rows() == n_prev,
          "short_conv shapes disagree");
    check(d_conv >= 1 && d_conv <= k::kMaxConv,
          "short_conv: the CUDA kernel takes kernels of 1.." + std::to_string(k::kMaxConv) + " taps");
    check_cuda(k::short_conv_silu(x.f32(), weight.f32(), state.f32(), n, D, int(d_conv), cs()), "short_conv_silu");
  }

  void kda_gate(const Tensor& g, const Tensor& dt_bias, const Tensor& a, int64_t head_dim, bool has_lower_bound,
                float lower_bound) override {
    const OpProfile::Scope timed(be_.profile(), "kimi kda_gate");
    const int64_t D = g.width();
    check(head_dim > 0 && D % head_dim == 0 && is_f32(g) && is_f32(dt_bias) && is_f32(a) && dt_bias.numel() == D &&
              a.numel() == D / head_dim,
          "kda_gate shapes disagree");
    check_cuda(k::kda_gate(g.f32(), dt_bias.f32(), a.f32(), g.rows(), D, head_dim, has_lower_bound, lower_bound, cs()),
               "kda_gate");
  }

  void delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& state, const Tensor& o) override {
    const OpProfile::Scope timed(be_.profile(), "kimi delta_rule");
    const int64_t hd = delta_rule_head_dim(q, k, v, g, beta, state, o), H = beta.width(), n = q.rows();
    check(is_f32(q) && is_f32(k) && is_f32(v) && is_f32(g) && is_f32(beta) && is_f32(state) && is_f32(o),
          "delta_rule shapes disagree");
    const int64_t max_hd = k::delta_rule_max_head_dim();
    check(hd <= max_hd, "delta_rule: head_dim " + std::to_string(hd) + " is over the CUDA kernel's " +
                            std::to_string(max_hd) + " (the state must fit in shared memory)");
    check_cuda(k::delta_rule(q.f32(), k.f32(), v.f32(), g.f32(), beta.f32(), state.f32(), o.f32(), n, H, hd, cs()),
               "delta_rule");
  }

  void delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          const Tensor& state, const Tensor& o, int64_t chunk) override {
    const OpProfile::Scope timed(be_.profile(), "kimi delta_rule_chunked");
    const int64_t hd = delta_rule_head_dim(q, k, v, g, beta, state, o), H = beta.width(), n = q.rows();
    check(is_f32(q) && is_f32(k) && is_f32(v) && is_f32(g) && is_f32(beta) && is_f32(state) && is_f32(o),
          "delta_rule shapes disagree");
    check(chunk > 0, "delta_rule_chunked: the chunk length must be positive");
    check(hd % 4 == 0 && hd <= k::kChunkMaxHeadDim,
          "delta_rule_chunked: head_dim " + std::to_string(hd) + " is not a multiple of 4 up to the CUDA kernel's " +
              std::to_string(k::kChunkMaxHeadDim));
    check(chunk % 4 == 0 && chunk <= k::kMaxChunk, "delta_rule_chunked: the CUDA kernel takes chunks of a multiple of 4 up to " +
                                                       std::to_string(k::kMaxChunk) + " tokens");
    if (n == 0) return;
    // the chunks' products, freed in stream order once the kernels are enqueued
    const Tensor scratch = be_.alloc(XPACK_TYPE_F32, k::delta_chunk_scratch_floats(n, H, hd, chunk), 1);
    check_cuda(k::delta_rule_chunked(q.f32(), k.f32(), v.f32(), g.f32(), beta.f32(), state.f32(), o.f32(), n, H, hd,
                                     chunk, scratch.f32(), cs()),
               "delta_rule_chunked");
  }

  // 16 tokens: 3.5x as fast as the recurrent step at Kimi-K3's dims on an H200; 32 is within 4 %
  // of it, 64 half as fast (doc/xpack-run.md, "The chunked delta rule")
  int64_t delta_rule_chunk(int64_t head_dim) const override {
    return head_dim % 4 == 0 && head_dim <= k::kChunkMaxHeadDim ? 16 : 0;
  }

  void mla_attention(const Tensor& q, const Tensor& latent, const Tensor& rope_key, const Tensor& k_b,
                     const Tensor& v_b, int64_t n_head, int64_t pos0, float scale, const Tensor& o) override {
    const OpProfile::Scope timed(be_.profile(), "kimi mla_attention");
    const int64_t H = n_head, n = q.rows(), kv = latent.width(), rope = rope_key.width(), nope = k_b.width();
    check(H > 0 && o.width() % H == 0, "mla_attention shapes disagree");
    const int64_t hk = nope + rope, hv = o.width() / H;
    check(q.width() == H * hk && k_b.rows() == H * kv && v_b.width() == kv && v_b.rows() == H * hv &&
              latent.rows() == rope_key.rows() && latent.rows() >= pos0 + n && o.rows() == n && is_f32(q) &&
              is_f32(latent) && is_f32(rope_key) && is_f32(k_b) && is_f32(v_b) && is_f32(o),
          "mla_attention shapes disagree");
    if (n >= kMlaBatchTokens || pos0 + n >= g_mla_product_keys.load(std::memory_order_relaxed)) {
      mla_batched(q, latent, rope_key, k_b, v_b, H, pos0, scale, o);
      return;
    }
    const int64_t max_keys = k::mla_max_keys(kv);
    check(pos0 + n <= max_keys, "mla_attention: " + std::to_string(pos0 + n) + " positions are over the CUDA kernel's " +
                                    std::to_string(max_keys) + " (the scores must fit in shared memory)");
    k::MlaArgs a;
    a.q = q.f32();
    a.latent = latent.f32();
    a.rope_key = rope_key.f32();
    a.k_b = k_b.f32();
    a.v_b = v_b.f32();
    a.n = n;
    a.n_head = H;
    a.nope = nope;
    a.rope = rope;
    a.kv = kv;
    a.hv = hv;
    a.pos0 = pos0;
    a.scale = scale;
    a.o = o.f32();
    check_cuda(k::mla_attention(a, cs()), "mla_attention");
  }

 private:
  cudaStream_t cs() { return static_cast<cudaStream_t>(be_.stream()); }

  // mla_attention over a prompt, per chunk of m query tokens [t0, t0 + m) whose
  // K = pos0 + t0 + m keys are those its last token sees: each head's absorbed
  // queries QA [m][H][kv], the scores S [m * H][K] of every (token, head) in one
  // product (its latent part, then its rope part added), their causal softmax,
  // the latent mix LT [m * H][kv] = S latent, each head's value expansion into o.
  // No key limit: the scores live in global memory, a chunk's in at most
  // kScoreBudgetFloats (more only where one token's H rows alone are more).
  void mla_batched(const Tensor& q, const Tensor& latent, const Tensor& rope_key, const Tensor& k_b,
                   const Tensor& v_b, int64_t H, int64_t pos0, float scale, const Tensor& o) {
    namespace xk = xpack::kernels;
    const int64_t n = q.rows(), kv = latent.width(), rope = rope_key.width(), nope = k_b.width();
    const int64_t hk = nope + rope, hv = o.width() / H, max_keys = pos0 + n;
    const int64_t chunk = std::clamp<int64_t>(kScoreBudgetFloats / (H * max_keys), 1, kMlaMaxChunkTokens);
    const int64_t m_max = std::min(chunk, n);
    // one set for every chunk, freed in stream order after the last product
    const Tensor qa = be_.empty(XPACK_TYPE_F32, kv, m_max * H);
    const Tensor sc = be_.empty(XPACK_TYPE_F32, max_keys, m_max * H);  // a chunk's [m * H][K]
    const Tensor lt = be_.empty(XPACK_TYPE_F32, kv, m_max * H);
    xk::Context* ctx = be_.kernels_context();
    const cudaStream_t s = cs();
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0), K = pos0 + t0 + m, rows = m * H;
      const float* qc = q.f32() + t0 * H * hk;  // row t * H + h: token t0 + t, head h
      // per head h: QA[t][h] = k_b(h) q_nope[t][h], the head's rows H * hk apart in q, H * kv in QA
      if (nope > 0)
        check_kernels(xk::float_gemm(ctx, false, true, m, kv, nope, 1.0f, qc, H * hk, hk, k_b.f32(), nope, kv * nope,
                                     0.0f, qa.f32(), H * kv, kv, int(H), s),
                      "mla_attention absorbed query");
      else  // no nope part: the CPU's empty sums
        check_cuda(cudaMemsetAsync(qa.f32(), 0, size_t(rows * kv) * sizeof(float), s), "mla_attention absorbed query");
      check_kernels(xk::float_gemm(ctx, false, true, rows, K, kv, scale, qa.f32(), kv, 0, latent.f32(), kv, 0, 0.0f,
                                   sc.f32(), K, 0, 1, s),
                    "mla_attention scores");
      if (rope > 0)
        check_kernels(xk::float_gemm(ctx, false, true, rows, K, rope, scale, qc + nope, hk, 0, rope_key.f32(), rope, 0,
                                     1.0f, sc.f32(), K, 0, 1, s),
                      "mla_attention rope scores");
      check_cuda(xpack::rt::masked_softmax_rows(sc.f32(), K, rows, H, nullptr, pos0 + t0 + 1, nullptr, s),
                 "mla_attention softmax");
      check_kernels(xk::float_gemm(ctx, false, false, rows, kv, K, 1.0f, sc.f32(), K, 0, latent.f32(), kv, 0, 0.0f,
                                   lt.f32(), kv, 0, 1, s),
                    "mla_attention latent mix");
      // per head h: o[t][h] = v_b(h) LT[t][h]
      check_kernels(xk::float_gemm(ctx, false, true, m, hv, kv, 1.0f, lt.f32(), H * kv, kv, v_b.f32(), kv, hv * kv,
                                   0.0f, o.f32() + t0 * H * hv, H * hv, hv, int(H), s),
                    "mla_attention value expansion");
    }
  }

  CudaBackend& be_;
};

}  // namespace

void set_cuda_mla_product_keys(int64_t keys) {
  g_mla_product_keys.store(keys < 0 ? kMlaProductKeys : keys, std::memory_order_relaxed);
}

// kimi_ops.cpp asks for this under XRUN_HAVE_CUDA: nullptr unless `be` is the CUDA backend.
std::unique_ptr<KimiOps> make_cuda_kimi_ops(Backend& be) {
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) return std::make_unique<CudaKimiOps>(*cuda);
  return nullptr;
}

}  // namespace xrun::kimi_k3
