#include "sampling.h"

#include <cmath>
#include <vector>

namespace xrun {

int32_t argmax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: the first maximum wins
  }
  return best;
}

int32_t Sampler::sample(const float* logits, int n) {
  if (temperature_ <= 0.0f) return argmax(logits, n);
  const float mx = logits[argmax(logits, n)];
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    p[i] = std::exp(static_cast<double>(logits[i] - mx) / temperature_);
    sum += p[i];
  }
  // Inverse-CDF draw from a uniform in [0, sum): deterministic for a given seed.
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  for (int i = 0; i < n; ++i) {
    if (u < p[i]) return i;
    u -= p[i];
  }
  return argmax(logits, n);
}

}  // namespace xrun
