// --router-skew (see synth_skew.h).
#include "synth_skew.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

namespace synth {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double uniform01(uint64_t& s) { return static_cast<double>(splitmix64(s) >> 11) * 0x1p-53; }

// Box-Muller; 1 - u keeps the log finite.
double normal(uint64_t& s) {
  const double u = 1.0 - uniform01(s), v = uniform01(s);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

double gate(Gating g, double z) {
  if (g == Gating::Sigmoid) return 1.0 / (1.0 + std::exp(-z));
  return std::sqrt(z > 20.0 ? z : std::log1p(std::exp(z)));
}

// The spread of one token's router logits over the experts: ffn_gate_inp's F32
// entries are uniform in [-1/16, 1/16) (variance 1/768) and x has RMS 1.
double logit_sigma(uint64_t embd) { return std::sqrt(static_cast<double>(embd) / 768.0); }

// Mean of ln r under Zipf(a) over 1..n: decreasing in a.
double mean_log_rank(double a, size_t n) {
  double h = 0.0, m = 0.0;
  for (size_t r = 1; r <= n; ++r) {
    const double w = std::pow(static_cast<double>(r), -a);
    h += w;
    m += w * std::log(static_cast<double>(r));
  }
  return m / h;
}

// The k best of score[e] + bias[e], best first (ties to the lower id, as top_k does).
void top_k(const double* score, const std::vector<double>& bias, uint32_t k, std::vector<uint32_t>& idx,
           std::vector<double>& v) {
  const uint32_t n = static_cast<uint32_t>(bias.size());
  v.resize(n);
  idx.resize(n);
  for (uint32_t e = 0; e < n; ++e) v[e] = score[e] + bias[e];
  std::iota(idx.begin(), idx.end(), 0u);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](uint32_t a, uint32_t b) { return v[a] != v[b] ? v[a] > v[b] : a < b; });
}

// Tokens the calibration simulates: the fitted exponent's own noise stays near 0.02.
constexpr uint32_t kCalibrationTokens = 2048;

}  // namespace

std::vector<double> zipf_weights(uint64_t seed, uint32_t layer, uint32_t n_expert, double exponent) {
  std::vector<uint32_t> rank(n_expert);
  std::iota(rank.begin(), rank.end(), 0u);
  uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (uint64_t{layer} + 1));
  for (uint32_t i = n_expert; i > 1; --i) std::swap(rank[i - 1], rank[splitmix64(s) % i]);  // Fisher-Yates
  std::vector<double> w(n_expert);
  for (uint32_t e = 0; e < n_expert; ++e) w[e] = std::pow(static_cast<double>(rank[e]) + 1.0, -exponent);
  return w;
}

double fit_zipf_exponent(const std::vector<uint64_t>& counts) {
  double total = 0.0, log_sum = 0.0;
  for (size_t r = 0; r < counts.size(); ++r) {
    total += static_cast<double>(counts[r]);
    log_sum += static_cast<double>(counts[r]) * std::log(static_cast<double>(r + 1));
  }
  if (total == 0.0 || counts.size() < 2) return 0.0;
  const double target = log_sum / total;
  double lo = -8.0, hi = 8.0;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (mean_log_rank(mid, counts.size()) > target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double max_route_exponent(uint32_t n_expert, uint32_t top_k) {
  std::vector<uint64_t> counts(n_expert);
  for (uint32_t r = 0; r < top_k && r < n_expert; ++r) counts[r] = 1;
  return fit_zipf_exponent(counts);
}

xpack::Result<double> calibrate_bias_scale(Gating g, uint64_t embd, uint32_t n_expert, uint32_t top_k_,
                                           double exponent) {
  if (exponent <= 0.0 || n_expert < 2) return 0.0;
  const double limit = max_route_exponent(n_expert, top_k_);
  // Near the limit beta grows without bound and routing freezes on the same k experts.
  if (exponent > limit - 0.05)
    return xpack::err(XPACK_E_INVALID_ARG,
                      "--router-skew {}: top-{} routing over {} experts reaches at most {:.2f} (every token on "
                      "the same {} experts); give at most {:.2f}",
                      exponent, top_k_, n_expert, limit, top_k_, limit - 0.05);
  // The scores, drawn once: with the same draws for every beta, each token's
  // experts only move to better ranks as beta grows, so the fitted exponent is
  // monotone in beta and bisection finds it.
  const double sigma = logit_sigma(embd);
  std::vector<double> score(size_t{kCalibrationTokens} * n_expert);
  uint64_t s = 0x5EEDC0FFEE123457ull;
  for (double& x : score) x = gate(g, sigma * normal(s));
  std::vector<double> log_w(n_expert), bias(n_expert), v;
  for (uint32_t r = 0; r < n_expert; ++r) log_w[r] = -exponent * std::log(static_cast<double>(r) + 1.0);
  std::vector<uint64_t> counts(n_expert);
  std::vector<uint32_t> idx;
  auto fitted = [&](double beta) {
    std::fill(counts.begin(), counts.end(), 0);
    for (uint32_t r = 0; r < n_expert; ++r) bias[r] = beta * log_w[r];
    for (uint32_t t = 0; t < kCalibrationTokens; ++t) {
      top_k(score.data() + size_t{t} * n_expert, bias, top_k_, idx, v);
      for (uint32_t j = 0; j < top_k_; ++j) ++counts[idx[j]];
    }
    return fit_zipf_exponent(counts);
  };
  double lo = 0.0, hi = 1e-3;
  for (int i = 0; i < 40 && fitted(hi) < exponent; ++i) lo = hi, hi *= 2.0;
  if (fitted(hi) < exponent)
    return xpack::err(XPACK_E_INTERNAL, "--router-skew {}: no bias scale reaches it", exponent);
  while (hi - lo > 1e-4 * hi) {
    const double mid = 0.5 * (lo + hi);
    (fitted(mid) < exponent ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

xpack::Result<double> apply_router_skew(Model& m, const Options& o) {
  if (o.arch == Arch::Mixtral)
    return xpack::err(XPACK_E_INVALID_ARG, "--router-skew needs a router bias or hash table (deepseek4, kimi-k3)");
  const Gating g = o.arch == Arch::KimiK3 ? Gating::Sigmoid : Gating::SqrtSoftplus;
  XPACK_ASSIGN_OR_RETURN(const double beta, calibrate_bias_scale(g, o.embd, o.experts, o.top_k, o.router_skew));
  const double sigma = logit_sigma(o.embd);
  for (TensorSpec& t : m.tensors) {
    const bool bias = ends_with(t.name, ".exp_probs_b.bias"), hash = ends_with(t.name, ".ffn_gate_tid2eid.weight");
    if (!bias && !hash) continue;
    const uint32_t layer = static_cast<uint32_t>(std::strtoul(t.name.c_str() + 4, nullptr, 10));  // "blk.N."
    std::vector<double> b = zipf_weights(o.seed, layer, o.experts, o.router_skew);
    for (double& x : b) x = beta * std::log(x);
    if (bias) {
      t.bytes.resize(4 * b.size());
      for (size_t e = 0; e < b.size(); ++e) {
        const float f = static_cast<float>(b[e]);
        std::memcpy(t.bytes.data() + 4 * e, &f, 4);
      }
      continue;
    }
    // One row per token id: the router's choice for a token of its own noise.
    const uint64_t k = t.ne[0], rows = t.ne[1];
    t.bytes.resize(4 * k * rows);
    uint64_t s = o.seed ^ (0x9E6C63D0676A9A99ull * (uint64_t{layer} + 1));
    std::vector<double> score(o.experts), v;
    std::vector<uint32_t> idx;
    for (uint64_t r = 0; r < rows; ++r) {
      for (double& x : score) x = gate(g, sigma * normal(s));
      top_k(score.data(), b, static_cast<uint32_t>(k), idx, v);
      for (uint64_t j = 0; j < k; ++j) {
        const int32_t id = static_cast<int32_t>(idx[j]);
        std::memcpy(t.bytes.data() + 4 * (r * k + j), &id, 4);
      }
    }
  }
  return beta;
}

}  // namespace synth
