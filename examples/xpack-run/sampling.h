// Picking the next token from a row of logits.
#pragma once

#include <cstdint>
#include <random>

namespace xrun {

// Index of the largest logit; ties go to the lowest id (llama.cpp's greedy rule).
int32_t argmax(const float* logits, int n);

class Sampler {
 public:
  // temperature 0 = greedy.
  Sampler(float temperature, uint64_t seed) : temperature_(temperature), rng_(seed) {}
  int32_t sample(const float* logits, int n);

 private:
  float temperature_;
  std::mt19937_64 rng_;
};

}  // namespace xrun
