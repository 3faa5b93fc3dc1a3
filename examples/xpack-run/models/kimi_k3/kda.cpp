// Kimi Delta Attention (KDA), the linear-attention layer of Kimi-K3, as
// llama.cpp's kimi-k3 graph computes it:
//
//   q, k, v = silu(causal_conv1d(W{q,k,v} x))         short convolutions, own state
//   g       = lower_bound * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias))   (K3)
//           = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)   (no lower bound: kimi-linear)
//   beta    = sigmoid(W_beta x)                                 one per head
//   q, k    = l2_norm(q), l2_norm(k);  q *= 1/sqrt(head_dim)
//   per head, per token (S is [key][value]):
//     S = diag(exp(g)) S;  S += k (beta (v - S^T k))^T;  o = S^T q
//   out     = W_o( rms_norm(o) * ssm_norm * sigmoid(W_g x) )
//
// A batch of at least the backend's chunk length runs the chunked form of the
// delta rule (KimiOps::delta_rule_chunked: products over the chunk, which is
// what a GPU runs fast), anything shorter and decode the recurrent step; both
// are the same recurrence, equal to within float rounding (as in llama.cpp,
// which also chunks a batch and steps a single token).
#include <cmath>

#include "kimi_k3.h"
#include "xpack/xpack.h"

namespace xrun::kimi_k3 {

namespace {

constexpr uint32_t kF32 = XPACK_TYPE_F32;

}  // namespace

KdaLayer::KdaLayer(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il)
    : hp_(hp), be_(be), ops_(ops) {
  const int64_t E = hp.n_embd, D = hp.d_inner, H = hp.n_head, hd = hp.kda_head_dim;
  // conv1d is stored 4-D [d_conv, 1, d_inner, 1] or 3-D (quantizers drop the trailing 1)
  const char* conv_names[3] = {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"};
  for (int i = 0; i < 3; ++i) conv_w_[i] = float_weight(be, w.get(layer_name(il, conv_names[i]), {hp.d_conv, 1, D}));
  wq_ = be.weight(w.get(layer_name(il, "attn_q.weight"), {E, D}));
  wk_ = be.weight(w.get(layer_name(il, "attn_k.weight"), {E, D}));
  wv_ = be.weight(w.get(layer_name(il, "attn_v.weight"), {E, D}));
  f_a_ = be.weight(w.get(layer_name(il, "ssm_f_a.weight"), {E, hd}));
  f_b_ = be.weight(w.get(layer_name(il, "ssm_f_b.weight"), {hd, D}));
  beta_ = be.weight(w.get(layer_name(il, "ssm_beta.weight"), {E, H}));
  a_ = float_weight(be, w.get(layer_name(il, "ssm_a"), {H}));
  dt_bias_ = float_weight(be, w.get(layer_name(il, "ssm_dt.bias"), {D}));
  g_ = be.weight(w.get(layer_name(il, "ssm_g.weight"), {E, D}));
  o_norm_ = float_weight(be, w.get(layer_name(il, "ssm_norm.weight"), {hd}));
  wo_ = be.weight(w.get(layer_name(il, "attn_output.weight"), {D, E}));
}

void KdaLayer::init_state(KdaState& st) const {
  for (auto& c : st.conv) c = be_.alloc(kF32, hp_.d_inner, hp_.d_conv - 1);
  st.s = be_.alloc(kF32, hp_.kda_head_dim * hp_.kda_head_dim, hp_.n_head);
}

void KdaLayer::forward(const Tensor& x, KdaState& st, const Tensor& out) const {
  const int64_t n = x.rows(), D = hp_.d_inner, H = hp_.n_head, hd = hp_.kda_head_dim;
  const float eps = hp_.norm_eps;

  // --- every projection of the input, in one call: q, k, v, the forget
  // gate's low rank, the write strengths, the output gate
  // q, k and v in one allocation, in that order, so that q and k are one range
  // of rows for their norm below
  const Tensor qkv = be_.empty(kF32, D, 3 * n);
  const Tensor q = qkv.row_range(0, n), k = qkv.row_range(n, n), v = qkv.row_range(2 * n, n);
  const Tensor fa = be_.empty(kF32, f_a_.rows(), n), beta = be_.empty(kF32, H, n), gate = be_.empty(kF32, D, n);
  be_.shared_input_matmul(x, {{&wq_, &q}, {&wk_, &k}, {&wv_, &v}, {&f_a_, &fa}, {&beta_, &beta}, {&g_, &gate}});

  // --- q, k, v: a short causal convolution with its own state
  ops_.short_conv_silu(q, conv_w_[0], st.conv[0]);
  ops_.short_conv_silu(k, conv_w_[1], st.conv[1]);
  ops_.short_conv_silu(v, conv_w_[2], st.conv[2]);

  // --- per-channel decay (log space), from the low-rank forget gate
  const Tensor g = be_.empty(kF32, D, n);
  be_.matmul(f_b_, fa, g);
  ops_.kda_gate(g, dt_bias_, a_, hd, hp_.has_gate_lower_bound, hp_.gate_lower_bound);

  // --- write strength, one per head
  be_.unary(Unary::sigmoid, beta, beta);

  // --- unit-length queries and keys; the 1/sqrt(d) scale goes on q
  const Tensor qk_heads = qkv.row_range(0, 2 * n).reshaped(hd, 2 * n * H), q_heads = q.reshaped(hd, n * H);
  be_.l2_norm(qk_heads, eps, qk_heads);
  be_.scale(q_heads, 1.0f / std::sqrt(static_cast<float>(hd)), q_heads);

  // --- gated delta rule, one state matrix per head: chunked for a prefill
  const Tensor o = be_.empty(kF32, D, n);  // the delta rule writes every element
  const int64_t chunk = ops_.delta_rule_chunk(hd);
  if (chunk > 0 && n >= chunk)
    ops_.delta_rule_chunked(q, k, v, g, beta, st.s, o, chunk);
  else
    ops_.delta_rule(q, k, v, g, beta, st.s, o);

  // --- per-head rms norm, full-rank sigmoid output gate, output projection
  const Tensor o_heads = o.reshaped(hd, n * H);
  be_.rms_norm(o_heads, &o_norm_, eps, o_heads);
  be_.unary(Unary::sigmoid, gate, gate);
  be_.mul(o, gate, o);
  be_.matmul(wo_, o, out);
}

}  // namespace xrun::kimi_k3
