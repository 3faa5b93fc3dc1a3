// Hyper-connection sites and head (see hyper_connections.h); the mixing
// itself is a deepseek4 operation (ds4_ops.h).
#include "hyper_connections.h"

#include "xpack/xpack.h"

namespace xrun::ds4 {

namespace {

// mixes = fn . flattened copies; the ops scale them by the copies' rms_norm
// (fn . rms_norm(x) = rms_norm's scale times fn . x), which spares writing the
// normed copies and a launch per site.
Tensor hc_mixes(Backend& be, const Tensor& fn, const Tensor& stream) {
  const Tensor mixes = be.empty(XPACK_TYPE_F32, fn.rows(), stream.rows());
  be.matmul(fn, stream, mixes);
  return mixes;
}

}  // namespace

HcShape hc_shape(const Hparams& hp) { return {hp.hc_mult, hp.n_embd, hp.hc_sinkhorn_iters, hp.hc_eps, hp.rms_eps}; }

HcSite::HcSite(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, const std::string& prefix)
    : hp_(hp), be_(be), ops_(ops) {
  const int64_t mix = hp.hc_mix_dim();
  fn_ = be.weight(w.get(prefix + "_fn.weight", {hp.hc_mult * hp.n_embd, mix}));
  base_ = float_weight(be, w.get(prefix + "_base.weight", {mix}));
  scale_ = float_weight(be, w.get(prefix + "_scale.weight", {3}));
}

void HcSite::pre(const Tensor& stream, const Tensor& input, HcMixing& mix, const Tensor* norm) const {
  const int64_t n = stream.rows(), hc = hp_.hc_mult;
  mix.post = be_.empty(XPACK_TYPE_F32, hc, n);
  mix.comb = be_.empty(XPACK_TYPE_F32, hc * hc, n);
  ops_.hc_pre(hc_shape(hp_), hc_mixes(be_, fn_, stream), base_, scale_, stream, input, mix.post, mix.comb, norm);
}

void HcSite::post(const Tensor& output, const Tensor& residual, const HcMixing& mix, const Tensor& stream) const {
  ops_.hc_post(hc_shape(hp_), output, residual, mix.post, mix.comb, stream);
}

HcHead::HcHead(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops) : hp_(hp), be_(be), ops_(ops) {
  fn_ = be.weight(w.get("output_hc_fn.weight", {hp.hc_mult * hp.n_embd, hp.hc_mult}));
  base_ = float_weight(be, w.get("output_hc_base.weight", {hp.hc_mult}));
  scale_ = float_weight(be, w.get("output_hc_scale.weight", {1}));
}

void HcHead::collapse(const Tensor& stream, const Tensor& out, const Tensor* norm) const {
  ops_.hc_head(hc_shape(hp_), hc_mixes(be_, fn_, stream), base_, scale_, stream, out, norm);
}

}  // namespace xrun::ds4
