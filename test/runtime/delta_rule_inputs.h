// Inputs of kimi-k3's delta rule as KdaLayer feeds them, for the CPU test
// (test_kimi_delta_rule.cpp) and the CUDA one (test_kimi_ops_cuda.cpp), which
// must exercise the same ranges: q, k l2-normed per head (q then scaled by
// 1/sqrt(hd)), v in (-2, 2), gates from mild to saturated at Kimi-K3's bound
// (and far below it: the form without a bound), write strengths 0, 1 or random.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace delta_rule_test {

enum class Gate { mild, mixed, saturated, unbounded };
enum class Beta { zero, one, random };

struct Inputs {
  int64_t n, H, hd;
  std::vector<float> q, k, v, g, beta;
};

inline Inputs make_inputs(int64_t n, int64_t H, int64_t hd, Gate gate, Beta bm, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), u01(0.0f, 1.0f);
  const size_t m = size_t(n * H * hd);
  Inputs in{n, H, hd, std::vector<float>(m), std::vector<float>(m), std::vector<float>(m), std::vector<float>(m),
            std::vector<float>(size_t(n * H))};
  for (auto* x : {&in.q, &in.k}) {
    for (auto& e : *x) e = u(rng);
    for (int64_t r = 0; r < n * H; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += double((*x)[r * hd + i]) * (*x)[r * hd + i];
      const double s = (x == &in.q ? 1.0 / std::sqrt(double(hd)) : 1.0) / std::sqrt(ss);
      for (int64_t i = 0; i < hd; ++i) (*x)[r * hd + i] = float((*x)[r * hd + i] * s);
    }
  }
  for (auto& e : in.v) e = 2.0f * u(rng);
  for (size_t e = 0; e < m; ++e) {
    switch (gate) {
      case Gate::mild: in.g[e] = -0.3f * u01(rng); break;                                  // slow decay
      case Gate::mixed: in.g[e] = (e % 3 == 0) ? -5.0f : -5.0f * u01(rng); break;          // K3's range
      case Gate::saturated: in.g[e] = -5.0f; break;                                        // at the bound
      case Gate::unbounded: in.g[e] = (e % 2 == 0) ? -80.0f * u01(rng) : -0.01f; break;    // no bound
    }
  }
  for (auto& b : in.beta) b = bm == Beta::zero ? 0.0f : bm == Beta::one ? 1.0f : u01(rng);
  return in;
}

}  // namespace delta_rule_test
