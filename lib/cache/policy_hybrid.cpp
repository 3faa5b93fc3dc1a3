// The seed's "reuse-lfu-lru-v2" (SGLang expert_pack.py _victim_slot): every
// request of a key raises its count (capped at 255) and the count survives
// eviction, so a key that keeps coming back is kept over one seen once. Ties go
// to the oldest resident key in decode and to the newest in prefill.
#include <algorithm>
#include <unordered_map>

#include "cache/ranked_keys.h"

namespace xpack::cache {
namespace {

constexpr uint32_t kFrequencyCap = 255;

class HybridPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kHybrid; }
  void on_request(Key k) override {
    uint32_t& f = frequency_[k];
    f = std::min(f + 1, kFrequencyCap);
    if (resident_.contains(k)) resident_.upsert(k, f, resident_.stamp(k));
  }
  void on_hit(Key k) override { resident_.upsert(k, frequency(k), ++clock_); }
  void on_insert(Key k) override { resident_.upsert(k, frequency(k), ++clock_); }
  void on_remove(Key k) override { resident_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase phase) override {
    return resident_.lowest(is_protected, phase == Phase::kPrefill);
  }
  bool prefetch_may_displace(Key incoming, Key victim) const override {
    return frequency(incoming) >= frequency(victim);
  }

 private:
  uint32_t frequency(Key k) const {
    auto it = frequency_.find(k);
    return it == frequency_.end() ? 0 : it->second;
  }
  RankedKeys resident_;
  std::unordered_map<Key, uint32_t> frequency_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_hybrid_policy() { return std::make_unique<HybridPolicy>(); }

}  // namespace xpack::cache
