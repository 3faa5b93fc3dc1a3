#include <unordered_map>

#include "cache/ranked_entries.h"

namespace xpack::cache {
namespace {

// Classic in-cache LFU: the count lives only while the key is resident.
class LfuPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLfu; }
  void on_hit(Key k) override { entries_.upsert(k, entries_.rank(k) + 1, ++clock_); }
  void on_insert(Key k) override { entries_.upsert(k, 1, ++clock_); }
  void on_remove(Key k) override { entries_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase) override {
    return entries_.lowest(is_protected, false);
  }
  // A hint enters with count 1; it may displace only an entry used at most once.
  bool prefetch_may_displace(Key, Key victim) const override {
    return entries_.rank(victim) <= 1;
  }

 private:
  RankedEntries entries_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lfu_policy() { return std::make_unique<LfuPolicy>(); }

}  // namespace xpack::cache
