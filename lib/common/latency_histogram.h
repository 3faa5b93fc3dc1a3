// A latency distribution for every timed path (reads, copies): log2 buckets of
// nanoseconds, each cut into 16 linear sub-buckets, so a quantile is reported within
// 6.25 % of the true value (plain log2 buckets could only say "between 1 and 2 ms",
// and the two histograms this replaced reported such bounds as percentiles). Fixed
// size, no allocation: cheap enough to record every read and every copy.
#pragma once
#include <array>
#include <cstdint>

namespace xpack {

class LatencyHistogram {
 public:
  static constexpr int kLog2Buckets = 64;
  static constexpr int kSub = 16;  // sub-buckets per power of two (a power of two)

  void record(uint64_t ns);
  uint64_t count() const { return count_; }
  uint64_t sum_ns() const { return sum_ns_; }
  uint64_t max_ns() const { return max_ns_; }
  // The upper bound of the bucket holding quantile q (0 < q <= 1): at least the true
  // quantile and less than 1/kSub above it (values below kSub are exact). 0 if empty.
  uint64_t quantile_ns(double q) const;
  // Counts per plain log2 bucket: bucket i holds values in [2^i, 2^(i+1)) (0 in 0).
  std::array<uint64_t, kLog2Buckets> log2_counts() const;
  void merge(const LatencyHistogram& o);
  void clear() { *this = LatencyHistogram(); }

  // Bucket index of a value and the largest value of a bucket (exposed for tests).
  static int index_of(uint64_t ns);
  static uint64_t upper_bound_of(int index);

 private:
  std::array<uint64_t, kLog2Buckets * kSub> buckets_{};
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;  // wraps only after ~584 years of summed latency
  uint64_t max_ns_ = 0;
};

}  // namespace xpack
