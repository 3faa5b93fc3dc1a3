// Adaptive: evicts as whichever of a few candidate policies would have hit most on the
// recent requests. No single policy wins on every workload: LRU wins where the hot set
// drifts (the seed's hybrid, whose counts never fade, falls far below it there), counts
// with history win where popularity is steady (they keep a popular expert through a
// run of tokens that skip it). So every candidate runs twice: a mirror that sees the
// cache's own residency (the one that names the victim when it leads) and a shadow that
// simulates a cache of the same size on its own, counting the hits it would have had.
// The shadows cost key bookkeeping only (no bytes), a few set operations per request.
#include <array>
#include <cmath>
#include <unordered_set>

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
constexpr double kLeadMargin = 1.01;

struct Shadow {
  std::unique_ptr<EvictionPolicy> policy;
  std::unordered_set<Key> resident;
  double score = 0;
};

class AdaptivePolicy final : public EvictionPolicy {
 public:
  AdaptivePolicy() {
    auto make = [](int i) -> std::unique_ptr<EvictionPolicy> {
      switch (i) {
        case 0: return make_lru_policy();
        case 1: return make_decay_policy(kShortHalfLife);
        case 2: return make_decay_policy(kLongHalfLife);
        default: return make_hybrid_policy();
      }
    };
    for (int i = 0; i < kCandidates; ++i) {
      mirror_[i] = make(i);
      shadow_[i].policy = make(i);
    }
  }
  PolicyKind kind() const override { return PolicyKind::kAdaptive; }

  void on_request(Key k) override {
    for (auto& m : mirror_) m->on_request(k);
    for (int i = 0; i < kCandidates; ++i) replay(shadow_[i], k);
  }
  void on_hit(Key k) override {
    for (auto& m : mirror_) m->on_hit(k);
  }
  void on_insert(Key k) override {
    for (auto& m : mirror_) m->on_insert(k);
    capacity_ = std::max(capacity_, ++resident_);
  }
  void on_remove(Key k) override {
    for (auto& m : mirror_) m->on_remove(k);
    --resident_;
  }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase phase) override {
    return mirror_[lead()]->choose_victim(is_protected, phase);
  }
  bool prefetch_may_displace(Key incoming, Key victim) const override {
    return mirror_[lead()]->prefetch_may_displace(incoming, victim);
  }

 private:
  static constexpr int kCandidates = 4;

  // The shadow cache of candidate s: a hit raises its score; a miss inserts k and, over
  // the cache's size, evicts the shadow's own victim (any key but k).
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
    while (s.resident.size() > capacity_) {
      const std::optional<Key> v = s.policy->choose_victim([k](Key x) { return x == k; }, Phase::kDecode);
      if (!v) break;
      s.policy->on_remove(*v);
      s.resident.erase(*v);
    }
  }
  // LRU leads unless another candidate's shadow hit clearly more (by kLeadMargin):
  // switching costs hits while the caches' contents differ, so a candidate that is
  // only as good is not worth it (and ties, before any evidence, stay with LRU).
  int lead() const {
    int best = 0;
    for (int i = 1; i < kCandidates; ++i)
      if (shadow_[i].score > shadow_[best].score) best = i;
    return shadow_[best].score > shadow_[0].score * kLeadMargin ? best : 0;
  }

  std::array<std::unique_ptr<EvictionPolicy>, kCandidates> mirror_;
  std::array<Shadow, kCandidates> shadow_;
  size_t resident_ = 0, capacity_ = 0;  // the cache's size: the most keys it has held
  const double fade_ = std::exp2(-1.0 / kScoreHalfLife);
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_adaptive_policy() { return std::make_unique<AdaptivePolicy>(); }

}  // namespace xpack::cache
