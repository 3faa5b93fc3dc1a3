#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>

namespace xrun {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool by_p_then_id(const Candidate& a, const Candidate& b) {
  return a.p > b.p || (a.p == b.p && a.id < b.id);
}

// The largest value that is not NaN (-inf for none), over independent lanes: a
// scan's chain through its running maximum took about 5 ns a value, 0.6 ms of
// each 2.6 ms DeepSeek-V4 decode step on the GPU machine's host (129280 logits,
// sampled stacks, 2026-12-04).
float max_value(const float* v, int n) {
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& m : lane) m = -INFINITY;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = v[i + k] > lane[k] ? v[i + k] : lane[k];
  float best = -INFINITY;
  for (; i < n; ++i) best = v[i] > best ? v[i] : best;
  for (float m : lane) best = m > best ? m : best;
  return best;
}

}  // namespace

std::string check_sampling_params(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return "--temp must be a finite number >= 0, got " + num(p.temperature);
  if (p.top_k < 0) return "--top-k must be >= 0 (0 = off), got " + std::to_string(p.top_k);
  if (!std::isfinite(p.top_p) || p.top_p < 0 || p.top_p > 1)
    return "--top-p must be in [0, 1] (1 = off), got " + num(p.top_p);
  if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1)
    return "--min-p must be in [0, 1] (0 = off), got " + num(p.min_p);
  if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0)
    return "--repeat-penalty must be a finite number > 0 (1 = off), got " + num(p.repeat_penalty);
  if (!std::isfinite(p.presence_penalty) || p.presence_penalty < -2 || p.presence_penalty > 2)
    return "--presence-penalty must be in [-2, 2] (0 = off), got " + num(p.presence_penalty);
  if (!std::isfinite(p.frequency_penalty) || p.frequency_penalty < -2 || p.frequency_penalty > 2)
    return "--frequency-penalty must be in [-2, 2] (0 = off), got " + num(p.frequency_penalty);
  if (p.penalty_last_n < -1)
    return "--repeat-last-n must be >= -1 (-1 = the whole sequence, 0 = off), got " +
           std::to_string(p.penalty_last_n);
  return {};
}

uint64_t random_seed() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  return ((hi << 32) ^ lo) & uint64_t{INT64_MAX};
}

// The plain scan's answer (best = i where logits[i] > logits[best]): the first
// index of the largest value, NaNs never winning, 0 when logits[0] is NaN.
int32_t argmax(const float* logits, int n) {
  if (n <= 0 || std::isnan(logits[0])) return 0;
  const float best = max_value(logits, n);
  // == also matches a zero of the other sign, which the scan would not have
  // replaced either: the first of the equal maxima is its answer too.
  for (int j = 0; j < n; ++j)
    if (logits[j] == best) return j;
  return 0;  // not reached: best is one of the values
}

Candidates::Candidates(const float* logits, int n, float temperature) : c_(static_cast<size_t>(std::max(n, 0))) {
  const float mx = max_value(logits, n);
  for (int i = 0; i < n; ++i) {
    // exp(-inf) = 0: a logit masked to -inf never survives a draw; nor does a NaN,
    // nor anything beside a +inf maximum (inf - inf is NaN).
    const double p = std::exp(static_cast<double>(logits[i] - mx) / temperature);
    c_[i] = {i, std::isnan(p) ? 0.0 : p};
    total_ += c_[i].p;
  }
  size_ = c_.size();
}

Candidates::Candidates(std::vector<Candidate> c) : c_(std::move(c)), size_(c_.size()) {
  for (const Candidate& x : c_) total_ += x.p;
}

void Candidates::sort_to(size_t end) {
  end = std::min(end, c_.size());
  if (end <= sorted_) return;
  // Two partial sorts at most, of the first 64 and then 1024 (a heap's pass
  // over the rest, cheap while most values fail their first comparison), then
  // the rest at once: a walk deeper than that costs what a full sort did, not
  // one partial sort per step. Past an eighth of the rest a whole sort is
  // cheaper than a partial one.
  end = end <= 64 ? 64 : end <= 1024 ? 1024 : c_.size();
  end = std::min(end, c_.size());
  if (8 * (end - sorted_) > c_.size() - sorted_) end = c_.size();
  if (end == c_.size())
    std::sort(c_.begin() + sorted_, c_.end(), by_p_then_id);
  else
    std::partial_sort(c_.begin() + sorted_, c_.begin() + end, c_.end(), by_p_then_id);
  sorted_ = end;
}

const Candidate& Candidates::at(size_t i) {
  sort_to(i + 1);
  return c_[i];
}

double Candidates::mass() {
  if (size_ == c_.size()) return total_;
  double s = 0;
  for (size_t i = 0; i < size_; ++i) s += c_[i].p;  // a cut prefix is sorted
  return s;
}

void Candidates::keep_top_k(int k) {
  if (k <= 0 || static_cast<size_t>(k) >= size_) return;
  sort_to(static_cast<size_t>(k));
  size_ = static_cast<size_t>(k);
}

void Candidates::keep_top_p(double p) {
  if (p >= 1.0 || size_ == 0) return;
  const double target = p * mass();
  double cum = 0;
  size_t keep = 0;
  while (keep < size_) {
    cum += at(keep++).p;
    if (cum >= target) break;
  }
  size_ = std::max<size_t>(keep, 1);
}

void Candidates::keep_min_p(double min_p) {
  if (min_p <= 0.0 || size_ == 0) return;
  const double floor = min_p * at(0).p;
  size_t keep = 1;
  while (keep < size_ && at(keep).p >= floor) ++keep;
  size_ = keep;
}

int32_t Candidates::pick(double u) {
  for (size_t i = 0; i < size_; ++i) {
    const Candidate& x = at(i);
    if (u < x.p) return x.id;
    u -= x.p;
  }
  return size_ ? c_[size_ - 1].id : 0;
}

void apply_penalties(float* logits, int n, const std::deque<int32_t>& window, const SamplingParams& p) {
  std::unordered_map<int32_t, int> count;
  for (int32_t t : window)
    if (t >= 0 && t < n) ++count[t];
  for (const auto& [tok, k] : count) {
    float& l = logits[tok];
    // Dividing a negative logit would raise it: multiply instead, so the penalty
    // always lowers the token (the CTRL paper's rule, as llama.cpp applies it).
    if (p.repeat_penalty != 1.0f) l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= static_cast<float>(k) * p.frequency_penalty + p.presence_penalty;
  }
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  const std::string why = check_sampling_params(p);
  if (!why.empty()) throw std::invalid_argument(why);
}

bool Sampler::penalties_on() const {
  return p_.penalty_last_n != 0 &&
         (p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f);
}

void Sampler::accept(int32_t token) {
  if (!penalties_on()) return;
  window_.push_back(token);
  if (p_.penalty_last_n > 0 && window_.size() > static_cast<size_t>(p_.penalty_last_n)) window_.pop_front();
}

int32_t Sampler::sample(const float* logits, int n) {
  if (penalties_on()) {
    scratch_.assign(logits, logits + n);
    apply_penalties(scratch_.data(), n, window_, p_);
    logits = scratch_.data();
  }
  // Greedy reads the row itself: no softmax, no rounding, llama.cpp's ids.
  if (p_.temperature <= 0.0f) return argmax(logits, n);
  Candidates c(logits, n, p_.temperature);
  c.keep_top_k(p_.top_k);
  c.keep_top_p(p_.top_p);
  c.keep_min_p(p_.min_p);
  // Nothing to draw from (every logit NaN or -inf, or a +inf one): greedy's answer.
  const double mass = c.mass();
  if (!(mass > 0) || !std::isfinite(mass)) return argmax(logits, n);
  // Inverse-CDF draw from a uniform in [0, mass): deterministic for a given seed.
  return c.pick(std::uniform_real_distribution<double>(0.0, mass)(rng_));
}

}  // namespace xrun
