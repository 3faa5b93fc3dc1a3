// Read latency distribution: log2 buckets of nanoseconds, each cut into 8 linear
// sub-buckets so p50/p99/p99.9 are within ~12% (plain log2 buckets would only
// say "between 1 and 2 ms"). Fixed size, no allocation on the hot path.
#pragma once
#include <array>
#include <cstdint>

namespace xpack::io {

class LatencyHistogram {
 public:
  static constexpr int kLog2Buckets = 64;
  static constexpr int kSub = 8;

  void record(uint64_t ns);
  uint64_t count() const { return count_; }
  // The upper bound of the bucket holding quantile q (0 < q <= 1); 0 if empty.
  uint64_t quantile_ns(double q) const;
  // Counts per plain log2 bucket: bucket i holds values in [2^i, 2^(i+1)) (0 in 0).
  std::array<uint64_t, kLog2Buckets> log2_counts() const;
  void merge(const LatencyHistogram& o);
  void clear() { *this = LatencyHistogram(); }

 private:
  static int index_of(uint64_t ns);
  static uint64_t upper_bound_of(int index);
  std::array<uint64_t, kLog2Buckets * kSub> buckets_{};
  uint64_t count_ = 0;
};

}  // namespace xpack::io
