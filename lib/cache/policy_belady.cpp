// Belady's MIN, for the simulator only: it needs every key's next request,
// which only an offline trace knows. Its hit rate bounds what any policy could
// reach on that trace with the same protection rules.
#include <unordered_map>

#include "cache/ranked_keys.h"

namespace xpack::cache {
namespace {

class BeladyPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kBelady; }
  void set_next_use(Key k, uint64_t pos) override {
    next_use_[k] = pos;
    if (resident_.contains(k)) resident_.upsert(k, rank_of(pos), 0);
  }
  void on_hit(Key k) override { resident_.upsert(k, rank_of(next_use(k)), 0); }
  void on_insert(Key k) override { resident_.upsert(k, rank_of(next_use(k)), 0); }
  void on_remove(Key k) override { resident_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase) override {
    return resident_.lowest(is_protected, false);
  }
  bool prefetch_may_displace(Key incoming, Key victim) const override {
    return next_use(incoming) < next_use(victim);
  }

 private:
  // Lowest rank is evicted first, so the farthest next use gets the lowest rank.
  static uint64_t rank_of(uint64_t next_use) { return UINT64_MAX - next_use; }
  uint64_t next_use(Key k) const {
    auto it = next_use_.find(k);
    return it == next_use_.end() ? UINT64_MAX : it->second;
  }
  RankedKeys resident_;
  std::unordered_map<Key, uint64_t> next_use_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_belady_policy() { return std::make_unique<BeladyPolicy>(); }

}  // namespace xpack::cache
