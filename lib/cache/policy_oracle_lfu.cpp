// LFU ranked by each key's request count over the whole trace, for the simulator
// only. Where requests are independent draws from fixed popularities (the routing of
// xpack-synth's --router-skew models, and nearly so a trained router's), keeping the
// most requested keys is the best any policy without lookahead can do, so its hit
// rate says how much of the distance to Belady's MIN a policy could still close and
// how much only knowing the next requests (prefetch) can.
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
