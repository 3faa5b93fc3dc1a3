#include "cache/ranked_keys.h"

namespace xpack::cache {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLru; }
  void on_hit(Key k) override { resident_.upsert(k, 0, ++clock_); }
  void on_insert(Key k) override { resident_.upsert(k, 0, ++clock_); }
  void on_remove(Key k) override { resident_.erase(k); }
  std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase) override {
    return resident_.lowest(is_protected, false);
  }
  // The LRU victim is by definition the least valuable resident key, and a hinted key
  // is about to be used, so a hint may displace it.
  bool prefetch_may_displace(Key, Key) const override { return true; }

 private:
  RankedKeys resident_;
  uint64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lru_policy() { return std::make_unique<LruPolicy>(); }

}  // namespace xpack::cache
