#include <unordered_map>

#include "cache/ranked_keys.h"

namespace xpack::cache {
namespace {

// Classic in-cache LFU: the count lives only while the key is resident.
class LfuPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLfu; }
  void on_hit(Key k) override { resident_.upsert(k, resident_.rank(k) + 1, ++clock_); }
  void on_insert(Key k) override { resident_.upsert(k, 1, ++clock_); }
  void on_remove(Key k) override { resident_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase) override {
    return resident_.lowest(is_protected, false);
  }
  // A hint enters with count 1; it may displace only a resident key used at most once.
  bool prefetch_may_displace(Key, Key victim) const override {
    return resident_.rank(victim) <= 1;
  }

 private:
  RankedKeys resident_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lfu_policy() { return std::make_unique<LfuPolicy>(); }

}  // namespace xpack::cache
