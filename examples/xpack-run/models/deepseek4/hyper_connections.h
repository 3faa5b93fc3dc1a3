// Manifold-constrained hyper-connections (mHC). The residual stream is hc_mult
// copies of the hidden state. Before each sub-layer (attention, FFN) a learned
// mix collapses the copies into the sub-layer input ("pre"); after it, every
// copy is rebuilt as post[dst] * output + sum_src comb[src][dst] * copy[src],
// where comb is made (nearly) doubly stochastic by Sinkhorn normalisation.
// At the top, one more "pre"-style mix collapses the copies for the LM head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hparams.h"

namespace xrun::ds4 {

// The per-token mixing of one hyper-connection site, produced by HcSite::pre.
struct HcMixing {
  std::vector<float> post;  // [n_tokens][hc]
  std::vector<float> comb;  // [n_tokens][hc (src)][hc (dst)]
};

// One site: hc_attn_* or hc_ffn_* of a block.
class HcSite {
 public:
  // prefix: "blk.N.hc_attn" or "blk.N.hc_ffn".
  HcSite(const Weights& w, const Hparams& hp, const std::string& prefix);

  // stream: [n][hc * n_embd]. Writes the sub-layer input [n][n_embd] and the
  // post/comb weights that post() needs.
  void pre(const float* stream, int n, float* input, HcMixing& mix) const;

  // Rebuilds the stream from the sub-layer output [n][n_embd] and the stream
  // as it was before the sub-layer (residual), both [n][hc * n_embd].
  void post(const float* output, const float* residual, int n, const HcMixing& mix,
            float* stream) const;

 private:
  void sinkhorn(float* comb) const;

  const Hparams& hp_;
  const WeightTensor* fn_;
  std::vector<float> base_;   // [pre hc | post hc | comb hc*hc]
  std::vector<float> scale_;  // [pre, post, comb]
};

// The final collapse of the copies before output_norm (output_hc_*).
class HcHead {
 public:
  HcHead(const Weights& w, const Hparams& hp);
  void collapse(const float* stream, int n, float* out) const;

 private:
  const Hparams& hp_;
  const WeightTensor* fn_;
  std::vector<float> base_;
  std::vector<float> scale_;
};

// Shared by the site and the head: mixes = fn . rms_norm(flattened copies).
void hc_mixes(const Hparams& hp, const WeightTensor& fn, const float* stream, int n, float* mixes);

// sum_h weight[h] * copy[h], the collapse of the copies of one token.
void hc_weighted_sum(const Hparams& hp, const float* stream_row, const float* weight, float* out);

}  // namespace xrun::ds4
