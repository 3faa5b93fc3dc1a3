// A request count that fades with a half-life (LRFU): the arithmetic shared by the
// decay policy and the adaptive policy's decay candidates.
#pragma once

#include <cmath>
#include <cstdint>

namespace xpack::cache {

// lambda of a half-life in requests: a request's weight is e^(-lambda * age).
inline double decay_rate(double half_life) { return std::log(2.0) / half_life; }

struct DecayedCount {
  double score = 0;
  uint64_t last = 0;  // the clock (in requests) of the last request

  // A request at clock `now` (>= last).
  void add(uint64_t now, double lambda) {
    score = score * std::exp(-lambda * double(now - last)) + 1.0;
    last = now;
  }
  // At any later clock t the score is score * e^(-lambda (t - last)), so keys order
  // by ln(score) + lambda * last at every t alike: the order changes only at a request.
  // Never negative (score >= 1 once requested).
  double order(double lambda) const { return std::log(score) + lambda * double(last); }
};

}  // namespace xpack::cache
