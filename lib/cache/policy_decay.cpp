// Decayed frequency (LRFU, Lee et al. 1999): a key's score is the sum over its past
// requests of 2^(-age / half_life), age counted in requests; the lowest score goes first.
// The score stays known after the key leaves (as the seed's hybrid keeps its counts), so a
// key that returns often is kept over one seen once; and it decays, so a hot set that
// drifts (a new prompt) is forgotten after some half-lives, where the hybrid's count
// capped at 255 never forgets. half_life -> 0 is LRU, -> infinity LFU with history.
#include <cmath>
#include <unordered_map>

#include "cache/decayed_count.h"
#include "cache/ranked_keys.h"

namespace xpack::cache {
namespace {

class DecayPolicy final : public EvictionPolicy {
 public:
  explicit DecayPolicy(double half_life) : lambda_(decay_rate(half_life)) {}
  PolicyKind kind() const override { return PolicyKind::kDecay; }
  void on_request(Key k) override {
    ++clock_;
    DecayedCount& h = history_[k];
    h.add(clock_, lambda_);
    if (keys_.contains(k)) keys_.upsert(k, rank(h), keys_.stamp(k));
  }
  void on_hit(Key k) override { keys_.upsert(k, rank(k), ++stamp_); }
  void on_insert(Key k) override { keys_.upsert(k, rank(k), ++stamp_); }
  void on_remove(Key k) override { keys_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase) override {
    return keys_.lowest(is_protected, false);
  }
  bool prefetch_may_displace(Key incoming, Key victim) const override { return rank(incoming) >= rank(victim); }

 private:
  // DecayedCount::order in fixed point with 2^-24 steps (the set orders integers): a
  // resident key's rank changes only when it is requested.
  uint64_t rank(const DecayedCount& h) const {
    return static_cast<uint64_t>(std::llround(std::ldexp(h.order(lambda_), 24)));
  }
  uint64_t rank(Key k) const {
    auto it = history_.find(k);
    return it == history_.end() ? 0 : rank(it->second);
  }
  double lambda_;
  uint64_t clock_ = 0, stamp_ = 0;
  RankedKeys keys_;
  std::unordered_map<Key, DecayedCount> history_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_decay_policy(double half_life) {
  return std::make_unique<DecayPolicy>(half_life);
}

}  // namespace xpack::cache
