// The operations only kimi-k3 uses, on backend tensors: the situ activation,
// cross-layer residual attention's mix, KDA's short convolution, decay gate and
// gated delta rule, and the absorbed MLA attention core. Each backend gets its
// implementation beside the CPU one (kimi_ops_cpu.h); the graph files only see
// this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "../../backend.h"

namespace xrun::kimi_k3 {

class KimiOps {
 public:
  virtual ~KimiOps() = default;

  // In place: g = beta*tanh(g/beta)*sigmoid(g) * linear_beta*tanh(u/linear_beta)
  // (linear_beta <= 0 leaves u untouched).
  virtual void situ(const Tensor& g, const Tensor& u, float beta, float linear_beta) = 0;

  // out = sum_c p_c ckpt_c + p_h cur, p = softmax over [s(ckpt_0) .. s(cur)],
  // s(row) = rms_norm(row) . score_w (sum in double); all [n][n_embd].
  virtual void res_mix(const Tensor& cur, const std::vector<Tensor>& ckpts, const Tensor& score_w, float eps,
                       const Tensor& out) = 0;

  // In place on x [n][D]: causal depthwise conv1d over time (weight [D][d_conv])
  // continuing from state [d_conv-1][D] (the previous raw inputs), then silu;
  // the state keeps the last d_conv-1 raw inputs.
  virtual void short_conv_silu(const Tensor& x, const Tensor& weight, const Tensor& state) = 0;

  // In place on g [n][D] (heads of head_dim): g += dt_bias, then
  // lower_bound * sigmoid(-(g * a[h])) with a lower bound, else softplus(g) * a[h].
  virtual void kda_gate(const Tensor& g, const Tensor& dt_bias, const Tensor& a, int64_t head_dim,
                        bool has_lower_bound, float lower_bound) = 0;

  // Gated delta rule per head (S [H][head_dim key][head_dim value], updated),
  // token by token: S = diag(exp(g)) S; S += k (beta (v - S^T k))^T; o = S^T q.
  // q, k, v, g, o: [n][H * head_dim]; beta [n][H].
  virtual void delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          const Tensor& state, const Tensor& o) = 0;

  // The same recurrence, the same arguments, over chunks of `chunk` tokens
  // (prefill): per head and chunk, with G the running sum of g from the
  // chunk's start (in double) and D the chunk's deltas d_r = beta_r (v_r - S_r'^T k_r)
  // (S_r' the state decayed by token r's gate, before its write),
  //   (I + diag(beta) A) D = diag(beta) (V - Kbar S0),  A[r][s] = sum_i k_ri k_si e^(G_ri - G_si), s < r
  //   O = Qbar S0 + B D,  B[r][s] = sum_i q_ri k_si e^(G_ri - G_si), s <= r
  //   S = diag(e^G_last) S0 + Ktilde^T D
  // (Qbar = q e^G, Kbar = k e^G, Ktilde = k e^(G_last - G)). Every exponent is
  // <= 0 and factors under e^-60 are flushed to zero: no factor overflows or is
  // subnormal. Equal to delta_rule within float rounding.
  virtual void delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const Tensor& beta, const Tensor& state, const Tensor& o, int64_t chunk) = 0;

  // The head_dim of delta_rule's arguments, after checking they agree (every
  // backend's recurrent and chunked forms take the same shapes); ModelError
  // "backend: delta_rule shapes disagree" otherwise.
  static int64_t delta_rule_head_dim(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                     const Tensor& beta, const Tensor& state, const Tensor& o) {
    const int64_t D = q.width(), H = beta.width(), n = q.rows();
    const int64_t hd = H > 0 && D % H == 0 ? D / H : 0;
    if (hd == 0 || k.width() != D || v.width() != D || g.width() != D || o.width() != D || k.rows() != n ||
        v.rows() != n || g.rows() != n || o.rows() != n || beta.rows() != n || state.numel() != H * hd * hd)
      throw ModelError("backend: delta_rule shapes disagree");
    return hd;
  }

  // The chunk length delta_rule_chunked runs best with at this head_dim; 0 where
  // this backend has no chunked form for it (the recurrent step is used).
  virtual int64_t delta_rule_chunk(int64_t head_dim) const = 0;

  // Absorbed MLA over every cached position up to each query (causal, queries
  // at positions pos0 + t): per head h, q = [W_kb q_nope | q_rope], scores
  // q . [latent | rope_key] * scale, softmax, o_h = W_vb (sum p latent).
  // q [n][H * (nope + rope)], latent [n_kv][kv], rope_key [n_kv][rope],
  // k_b [H * kv][nope], v_b [H * hv][kv], o [n][H * hv].
  virtual void mla_attention(const Tensor& q, const Tensor& latent, const Tensor& rope_key, const Tensor& k_b,
                             const Tensor& v_b, int64_t n_head, int64_t pos0, float scale, const Tensor& o) = 0;
};

// The implementation for `be` (throws ModelError for a backend without one).
std::unique_ptr<KimiOps> make_kimi_ops(Backend& be);

// CUDA builds: the CUDA mla_attention of a decode step (under 16 queries) takes
// the batched products from this many visible keys on, its one-kernel path below
// (negative: the default, 512). A switch for the tests' side-by-side timing; each
// path is within the same bound of the CPU. Thread safety: safe from any thread.
void set_cuda_mla_product_keys(int64_t keys);

}  // namespace xrun::kimi_k3
