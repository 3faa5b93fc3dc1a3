#include "common/latency_histogram.h"

#include <bit>
#include <cmath>

namespace xpack {

namespace {
constexpr int kSubBits = std::countr_zero(static_cast<unsigned>(LatencyHistogram::kSub));
static_assert((1 << kSubBits) == LatencyHistogram::kSub, "kSub must be a power of two");
}  // namespace

int LatencyHistogram::index_of(uint64_t ns) {
  if (ns < kSub) return static_cast<int>(ns);  // exact for tiny values
  int lg = 63 - std::countl_zero(ns);          // ns in [2^lg, 2^(lg+1)), lg >= kSubBits
  int sub = static_cast<int>((ns >> (lg - kSubBits)) & (kSub - 1));  // the next bits
  return lg * kSub + sub;
}

uint64_t LatencyHistogram::upper_bound_of(int index) {
  if (index < kSub) return static_cast<uint64_t>(index);
  int lg = index / kSub;
  int sub = index % kSub;
  // Values with top bits (1, sub) end just below (kSub + sub + 1) << (lg - kSubBits).
  unsigned __int128 ub = (static_cast<unsigned __int128>(kSub + sub + 1) << (lg - kSubBits)) - 1;
  return ub > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(ub);
}

void LatencyHistogram::record(uint64_t ns) {
  ++buckets_[index_of(ns)];
  ++count_;
  sum_ns_ += ns;
  if (ns > max_ns_) max_ns_ = ns;
}

uint64_t LatencyHistogram::quantile_ns(double q) const {
  if (count_ == 0) return 0;
  if (q <= 0) q = 0;
  if (q > 1) q = 1;
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (int i = 0; i < kLog2Buckets * kSub; ++i) {
    seen += buckets_[i];
    if (seen >= rank) return upper_bound_of(i);
  }
  return UINT64_MAX;
}

std::array<uint64_t, LatencyHistogram::kLog2Buckets> LatencyHistogram::log2_counts() const {
  std::array<uint64_t, kLog2Buckets> out{};
  for (int i = 0; i < kLog2Buckets * kSub; ++i) {
    if (buckets_[i] == 0) continue;
    int lg = i < kSub ? (i == 0 ? 0 : 63 - std::countl_zero(static_cast<uint64_t>(i))) : i / kSub;
    out[lg] += buckets_[i];
  }
  return out;
}

void LatencyHistogram::merge(const LatencyHistogram& o) {
  for (size_t i = 0; i < buckets_.size(); ++i) buckets_[i] += o.buckets_[i];
  count_ += o.count_;
  sum_ns_ += o.sum_ns_;
  if (o.max_ns_ > max_ns_) max_ns_ = o.max_ns_;
}

}  // namespace xpack
