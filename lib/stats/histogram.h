// Latency distribution in power-of-two nanosecond buckets: fixed size, no
// allocation, cheap enough to record every read and every copy.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace xpack::stats {

class Log2Histogram {
 public:
  static constexpr int kBuckets = 64;
  // Bucket i holds values in [2^i, 2^(i+1)); 0 goes into bucket 0.
  static int bucket_of(uint64_t ns) { return ns == 0 ? 0 : 63 - std::countl_zero(ns); }
  void record(uint64_t ns) {
    ++buckets_[bucket_of(ns)];
    ++count_;
    sum_ns_ += ns;
    if (ns > max_ns_) max_ns_ = ns;
  }
  uint64_t count() const { return count_; }
  uint64_t sum_ns() const { return sum_ns_; }
  uint64_t max_ns() const { return max_ns_; }
  const std::array<uint64_t, kBuckets>& buckets() const { return buckets_; }
  // Upper bound (2^(i+1)) of the bucket holding quantile q in (0, 1]; 0 if empty.
  uint64_t quantile_upper_ns(double q) const {
    if (count_ == 0) return 0;
    uint64_t need = uint64_t(q * double(count_));
    if (need == 0) need = 1;
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += buckets_[i];
      if (seen >= need) return i >= 63 ? UINT64_MAX : (uint64_t{2} << i);
    }
    return UINT64_MAX;
  }

 private:
  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;
  uint64_t max_ns_ = 0;
};

}  // namespace xpack::stats
