// Picking the next token from a row of logits. No I/O: the CLI and the server
// share it, each feeding its own requests' parameters.
//
// The chain, in order (doc/xpack-run.md, "Sampling"):
//   1. penalties on the logits, over the last `penalty_last_n` accepted tokens:
//      repeat (a positive logit divided by it, a negative one multiplied),
//      then frequency (minus count x value) and presence (minus value once);
//   2. temperature 0: the argmax of the penalised logits (ties to the lowest id);
//   3. otherwise softmax(logits / temperature), then top-k, top-p, min-p, each
//      on the candidates the previous one left (renormalised; Candidates);
//   4. an inverse-CDF draw over the survivors, most probable first, from a
//      seeded mt19937_64.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace xrun {

struct SamplingParams {
  float temperature = 0.0f;       // 0 = greedy
  int top_k = 0;                  // 0 = off
  float top_p = 1.0f;             // 1 = off; (0, 1]
  float min_p = 0.0f;             // 0 = off; [0, 1]
  float repeat_penalty = 1.0f;    // 1 = off; > 0
  float presence_penalty = 0.0f;  // 0 = off; OpenAI's range [-2, 2]
  float frequency_penalty = 0.0f; // 0 = off; OpenAI's range [-2, 2]
  int penalty_last_n = 64;        // tokens the penalties look back over; 0 = off, -1 = all
  uint64_t seed = 0;
};

// Empty when every value is usable, else one sentence naming the first bad one
// by its CLI flag name (the server maps it to its own field name).
std::string check_sampling_params(const SamplingParams& p);

// A fresh seed from std::random_device, within --seed's range (0 .. 2^63 - 1) so
// a printed seed can be given back to reproduce a run.
uint64_t random_seed();

// Index of the largest logit; ties go to the lowest id (llama.cpp's greedy rule).
int32_t argmax(const float* logits, int n);

// A token still in the running and its (unnormalised) probability.
struct Candidate {
  int32_t id;
  double p;
};

// The candidates of one draw, most probable first (p descending, ties by id
// ascending). The order is established a prefix at a time, as far as a filter or
// the draw looks: a draw over 100k+ tokens usually ends within the first few
// dozen, and a full sort took 7.5 ms of 129280 (dev host) where the whole step
// takes 2 on the GPU. Each filter keeps a prefix of that order and at least one
// token; none changes the weights.
class Candidates {
 public:
  // Weights exp((logit - max) / temperature) in double; NaN and -inf logits
  // weigh 0 (an all-NaN or +inf row gives mass() 0: Sampler falls back to greedy).
  Candidates(const float* logits, int n, float temperature);
  // Given weights, in id order or not (the tests' exact distributions).
  explicit Candidates(std::vector<Candidate> c);

  size_t size() const { return size_; }
  // The i-th most probable, i < size().
  const Candidate& at(size_t i);
  // The survivors' total weight: summed in the given order while nothing is cut
  // (so no sort is needed for it), else over the kept prefix in its order.
  double mass();

  void keep_top_k(int k);
  // The smallest prefix whose mass reaches p of mass() (the token that crosses p
  // is kept).
  void keep_top_p(double p);
  // Tokens with probability >= min_p x the most probable one's.
  void keep_min_p(double min_p);
  // Inverse CDF, most probable first: the first survivor whose cumulative weight
  // exceeds u, for u in [0, mass()); the last one if rounding leaves u past them.
  int32_t pick(double u);

 private:
  void sort_to(size_t end);

  std::vector<Candidate> c_;
  size_t size_ = 0;    // survivors: c_[0, size_) once anything is cut
  size_t sorted_ = 0;  // c_[0, sorted_) in order and ahead of every later one
  double total_ = 0;   // the weight of all of c_
};

// Applies the three penalties to `logits` (n_vocab values) in place for the
// tokens of `window` (ids outside [0, n) are ignored).
void apply_penalties(float* logits, int n, const std::deque<int32_t>& window, const SamplingParams& p);

class Sampler {
 public:
  // Throws std::invalid_argument with check_sampling_params' message.
  explicit Sampler(const SamplingParams& p);
  // The next token from `logits` (n values; not modified).
  int32_t sample(const float* logits, int n);
  // Records a token of the sequence (prompt tokens too) for the penalty window.
  void accept(int32_t token);
  // Forgets the accepted tokens (a chat that re-evaluates its conversation
  // accepts it again); the random stream continues.
  void clear_history() { window_.clear(); }
  const SamplingParams& params() const { return p_; }

 private:
  bool penalties_on() const;

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::deque<int32_t> window_;
  std::vector<float> scratch_;
};

}  // namespace xrun
