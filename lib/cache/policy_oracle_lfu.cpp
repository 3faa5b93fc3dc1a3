// LFU ranked by each key's request count over the whole trace, for the simulator
// only. Were requests independent draws from fixed popularities, keeping the most
// requested keys would be the best a policy without lookahead could do (in
// expectation); real and synthetic routing reuse experts from token to token, which
// recency can exploit, so it is a reference rather than a bound: its hit rate
// estimates how much of the distance to Belady's MIN an eviction policy could close,
// and how much is left to knowing the next requests (prefetch). doc/cache.md.
#include <unordered_map>

#include "cache/ranked_keys.h"

namespace xpack::cache {
namespace {

class OracleLfuPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kOracleLfu; }
  void set_trace_count(Key k, uint64_t n) override { count_[k] = n; }
  void on_hit(Key k) override { resident_.upsert(k, count(k), ++clock_); }
  void on_insert(Key k) override { resident_.upsert(k, count(k), ++clock_); }
  void on_remove(Key k) override { resident_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase) override {
    return resident_.lowest(is_protected, false);
  }
  bool prefetch_may_displace(Key incoming, Key victim) const override { return count(incoming) > count(victim); }

 private:
  uint64_t count(Key k) const {
    auto it = count_.find(k);
    return it == count_.end() ? 0 : it->second;
  }
  RankedKeys resident_;
  std::unordered_map<Key, uint64_t> count_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_oracle_lfu_policy() { return std::make_unique<OracleLfuPolicy>(); }

}  // namespace xpack::cache
