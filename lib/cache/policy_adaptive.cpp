// Adaptive: evicts as whichever of a few candidate policies would have hit most on the
// recent requests. No single policy wins on every workload: LRU wins where the hot set
// drifts (the seed's hybrid, whose counts never fade, falls far below it there), counts
// with history win where popularity is steady (they keep a popular expert through a run
// of tokens that skip it).
//
// The policy sits on the acquire path under the cache's lock, and a step of a resident
// model makes hundreds of requests that all hit, so a request costs O(1): one metadata
// row per key holds what every candidate ranks by (recency stamp, two decayed scores,
// the hybrid's capped count). Only an eviction, which comes with a read of megabytes,
// scans the resident keys for the leader's victim. Each candidate also runs a shadow
// cache of the same size that counts the hits it would have had; above 256 slots the
// shadows see a hashed 1/M of the keys in a cache of 1/M the size (spatial sampling, as
// SHARDS does for miss-ratio curves), which keeps their cost near 1/M.
#include <array>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/decayed_count.h"
#include "cache/policy.h"

namespace xpack::cache {
namespace {

// Half-lives of the decayed-frequency candidates, in requests (one decode token of
// DeepSeek-V4-Flash makes 43 x 6 = 258): short enough to follow a drifting hot set, and
// long enough to keep a steadily popular expert.
constexpr double kShortHalfLife = 1024, kLongHalfLife = 16384;
// The shadows' hit counts fade with this half-life (requests): the lead follows the
// workload of the last few prompts.
constexpr double kScoreHalfLife = 65536;
// LRU leads unless another candidate's shadow hit this much more: switching costs hits
// while the caches' contents differ, so a candidate that is only as good is not worth it.
constexpr double kLeadMargin = 1.01;
// Shadows sample keys once the cache has more slots than this.
constexpr uint64_t kShadowSlots = 256;
constexpr uint32_t kHybridCap = 255;  // the seed's count cap (policy_hybrid.cpp)

enum Candidate { kLruC, kShortC, kLongC, kHybridC, kCandidates };

std::unique_ptr<EvictionPolicy> make_candidate(int c) {
  switch (c) {
    case kLruC: return make_lru_policy();
    case kShortC: return make_decay_policy(kShortHalfLife);
    case kLongC: return make_decay_policy(kLongHalfLife);
    default: return make_hybrid_policy();
  }
}

struct Shadow {
  std::unique_ptr<EvictionPolicy> policy;
  std::unordered_set<Key> resident;
  double score = 0;
};

class AdaptivePolicy final : public EvictionPolicy {
 public:
  AdaptivePolicy() {
    for (int c = 0; c < kCandidates; ++c) shadow_[c].policy = make_candidate(c);
  }
  PolicyKind kind() const override { return PolicyKind::kAdaptive; }

  void on_request(Key k) override {
    ++clock_;
    Meta& m = meta_[k];
    m.count_short.add(clock_, kLambdaShort);
    m.count_long.add(clock_, kLambdaLong);
    // Their order only changes here: computed once, not in every eviction's scan.
    m.order_short = m.count_short.order(kLambdaShort);
    m.order_long = m.count_long.order(kLambdaLong);
    if (m.count < kHybridCap) ++m.count;
    if (sample_ && sampled(k))
      for (auto& s : shadow_) replay(s, k);
  }
  void on_hit(Key k) override { meta_[k].stamp = ++stamp_; }
  void on_insert(Key k) override {
    Meta& m = meta_[k];
    m.stamp = ++stamp_;
    m.pos = resident_.size();
    resident_.push_back({k, &m});  // unordered_map keeps element addresses across rehashing
    capacity_ = std::max<uint64_t>(capacity_, resident_.size());
  }
  void on_remove(Key k) override {
    auto it = meta_.find(k);
    if (it == meta_.end() || it->second.pos == kNotResident) return;
    const size_t pos = it->second.pos;
    resident_[pos] = resident_.back();
    resident_[pos].second->pos = pos;
    resident_.pop_back();
    it->second.pos = kNotResident;
  }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase phase) override {
    // The cache is full now, so its size is known: the shadows start here.
    if (!sample_) start_shadows();
    const int c = lead();
    std::optional<Key> best;
    Rank best_rank{};
    for (const auto& [k, m] : resident_) {
      if (is_protected(k)) continue;
      const Rank r = rank(c, *m, phase);
      if (!best || r < best_rank) {
        best = k;
        best_rank = r;
      }
    }
    return best;
  }
  bool prefetch_may_displace(Key incoming, Key victim) const override {
    const int c = lead();
    if (c == kLruC) return true;  // the LRU victim is the least valuable key by definition
    auto in = meta_.find(incoming);
    if (in == meta_.end()) return false;
    const Meta& v = meta_.at(victim);
    return rank(c, in->second, Phase::kDecode).value >= rank(c, v, Phase::kDecode).value;
  }

 private:
  static constexpr size_t kNotResident = std::numeric_limits<size_t>::max();
  static inline const double kLambdaShort = decay_rate(kShortHalfLife);
  static inline const double kLambdaLong = decay_rate(kLongHalfLife);

  struct Meta {
    uint64_t stamp = 0;         // last hit or insert: recency, and every candidate's tie-break
    DecayedCount count_short, count_long;    // the decay candidates' counts
    double order_short = 0, order_long = 0;  // and their orders (DecayedCount::order)
    uint32_t count = 0;         // the hybrid's, capped, kept across evictions
    size_t pos = kNotResident;  // index in resident_
  };
  // Lower goes first: the candidate's value, then the stamp (oldest first, but newest
  // first for the hybrid in prefill, as policy_hybrid.cpp).
  struct Rank {
    double value = 0;
    int64_t tie = 0;
    bool operator<(const Rank& o) const { return value != o.value ? value < o.value : tie < o.tie; }
  };
  Rank rank(int c, const Meta& m, Phase phase) const {
    const int64_t stamp = static_cast<int64_t>(m.stamp);
    switch (c) {
      case kLruC: return {0.0, stamp};
      case kShortC: return {m.order_short, stamp};
      case kLongC: return {m.order_long, stamp};
      default: return {double(m.count), phase == Phase::kPrefill ? -stamp : stamp};
    }
  }

  void start_shadows() {
    sample_ = 1;
    while (capacity_ / sample_ > kShadowSlots) sample_ *= 2;
    shadow_capacity_ = std::max<uint64_t>(1, capacity_ / sample_);
  }
  bool sampled(Key k) const {
    if (sample_ == 1) return true;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;  // Fibonacci hashing: the layer's and expert's bits mixed
    return (h >> 40) % sample_ == 0;
  }
  // The shadow cache of candidate s: a hit raises its score; a miss inserts k and, over
  // the shadow's size, evicts the shadow's own victim (any key but k).
  void replay(Shadow& s, Key k) {
    s.score *= fade_;
    s.policy->on_request(k);
    if (s.resident.count(k)) {
      s.score += 1;
      s.policy->on_hit(k);
      return;
    }
    s.policy->on_insert(k);
    s.resident.insert(k);
    while (s.resident.size() > shadow_capacity_) {
      const std::optional<Key> v = s.policy->choose_victim([k](Key x) { return x == k; }, Phase::kDecode);
      if (!v) break;
      s.policy->on_remove(*v);
      s.resident.erase(*v);
    }
  }
  int lead() const {
    int best = kLruC;
    for (int c = 1; c < kCandidates; ++c)
      if (shadow_[c].score > shadow_[best].score) best = c;
    return shadow_[best].score > shadow_[kLruC].score * kLeadMargin ? best : kLruC;
  }

  std::unordered_map<Key, Meta> meta_;
  std::vector<std::pair<Key, Meta*>> resident_;
  std::array<Shadow, kCandidates> shadow_;
  uint64_t clock_ = 0, stamp_ = 0, capacity_ = 0, shadow_capacity_ = 0;
  uint64_t sample_ = 0;  // 0 until the first eviction; then keys 1 in sample_ feed the shadows
  const double fade_ = std::exp2(-1.0 / kScoreHalfLife);
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_adaptive_policy() { return std::make_unique<AdaptivePolicy>(); }

}  // namespace xpack::cache
