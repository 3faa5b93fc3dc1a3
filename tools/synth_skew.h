// --router-skew A: a synthetic router whose expert popularity per layer follows a
// Zipf law of exponent A, set through the weights the runtime reads
// (doc/xpack-synth.md, "Router skew"):
//  - each layer ranks its experts by a random permutation (from the seed and the
//    layer) and gives the expert of rank r (0-based) the weight w = (r + 1)^-A;
//  - learned-router layers get exp_probs_b = beta * ln w. The runtime picks the
//    top-k of g(ffn_gate_inp . x) + exp_probs_b (g: the architecture's gating);
//    for a token the router logits are N(0, embd / 768) noise over the experts
//    (ffn_gate_inp uniform in [-1/16, 1/16), x RMS-normalised), and beta is the
//    scale at which, for independent tokens, the share of routes that go to the
//    expert of rank r fits r^-A (maximum likelihood over the ranks);
//  - hash-routed layers (deepseek4 ffn_gate_tid2eid) give each token id the
//    experts that router would pick for a token of its own noise, best first.
// How far a model's own hidden states move the result from this independent-token
// model (they correlate from token to token, which also gives temporal reuse) is
// measured, not set: test/runtime/synth_skew.py --report.
#pragma once

#include <cstdint>
#include <vector>

#include "common/result.h"
#include "synth_model.h"

namespace synth {

enum class Gating { SqrtSoftplus, Sigmoid };

// The Zipf weight of each expert of one layer, indexed by expert id.
std::vector<double> zipf_weights(uint64_t seed, uint32_t layer, uint32_t n_expert, double exponent);

// The maximum-likelihood exponent of a Zipf law over ranks 1..counts.size() for
// counts[r] draws of rank r + 1 (bisection on the mean log rank; clamped to [-8, 8]).
double fit_zipf_exponent(const std::vector<uint64_t>& counts);

// The exponent of routes that always take the top_k best-ranked experts: no bias
// scale gives more, so --router-skew refuses it.
double max_route_exponent(uint32_t n_expert, uint32_t top_k);

// The bias scale beta of the model above: deterministic (a fixed random stream of
// its own); 0 for exponent 0; an error where exponent >= max_route_exponent.
xpack::Result<double> calibrate_bias_scale(Gating g, uint64_t embd, uint32_t n_expert, uint32_t top_k,
                                           double exponent);

// Sets the contents of m's exp_probs_b.bias and ffn_gate_tid2eid tensors for
// o.router_skew; returns beta. Fails for a model without either (mixtral).
xpack::Result<double> apply_router_skew(Model& m, const Options& o);

}  // namespace synth
