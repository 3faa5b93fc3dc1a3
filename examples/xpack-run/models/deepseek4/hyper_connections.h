// Manifold-constrained hyper-connections (mHC). The residual stream is hc_mult
// copies of the hidden state. Before each sub-layer (attention, FFN) a learned
// mix collapses the copies into the sub-layer input ("pre"); after it, every
// copy is rebuilt as post[dst] * output + sum_src comb[src][dst] * copy[src],
// where comb is made (nearly) doubly stochastic by Sinkhorn normalisation.
// At the top, one more "pre"-style mix collapses the copies for the LM head.
#pragma once

#include <string>

#include "../../backend.h"
#include "ds4_ops.h"
#include "hparams.h"

namespace xrun::ds4 {

// The per-token mixing of one hyper-connection site, produced by HcSite::pre.
struct HcMixing {
  Tensor post;  // [n_tokens][hc]
  Tensor comb;  // [n_tokens][hc (src) * hc (dst)]
};

// One site: hc_attn_* or hc_ffn_* of a block.
class HcSite {
 public:
  // prefix: "blk.N.hc_attn" or "blk.N.hc_ffn".
  HcSite(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, const std::string& prefix);

  // stream: [n][hc * n_embd]. Writes the sub-layer input [n][n_embd] (with
  // `norm`, already through the sub-layer's rms_norm of that weight) and the
  // mixing that post() needs.
  void pre(const Tensor& stream, const Tensor& input, HcMixing& mix, const Tensor* norm = nullptr) const;

  // Rebuilds the stream from the sub-layer output [n][n_embd] and the stream
  // as it was before the sub-layer (residual), both [n][hc * n_embd]; stream may
  // be residual (in place).
  void post(const Tensor& output, const Tensor& residual, const HcMixing& mix, const Tensor& stream) const;

 private:
  const Hparams& hp_;
  Backend& be_;
  Ds4Ops& ops_;
  Tensor fn_;
  Tensor base_;   // [pre hc | post hc | comb hc*hc]
  Tensor scale_;  // [pre, post, comb]
};

// The final collapse of the copies before output_norm (output_hc_*).
class HcHead {
 public:
  HcHead(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops);
  // With `norm` (output_norm), out is already through its rms_norm.
  void collapse(const Tensor& stream, const Tensor& out, const Tensor* norm = nullptr) const;

 private:
  const Hparams& hp_;
  Backend& be_;
  Ds4Ops& ops_;
  Tensor fn_, base_, scale_;
};

HcShape hc_shape(const Hparams& hp);

}  // namespace xrun::ds4
