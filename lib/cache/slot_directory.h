// Which key occupies which slot, and the eviction decision. Shared by the
// runtime cache and xpack-sim so that the simulator replays exactly the
// runtime's placement rules: the first empty slot (lowest index) first, then
// the policy's victim among unprotected keys. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "cache/policy.h"

namespace xpack::cache {

class SlotDirectory {
 public:
  SlotDirectory(uint32_t n_slots, std::unique_ptr<EvictionPolicy> policy);

  uint32_t slot_count() const { return uint32_t(slot_key_.size()); }
  size_t resident_count() const { return key_slot_.size(); }
  std::optional<uint32_t> find(Key k) const;
  // The key in `slot`, if any.
  std::optional<Key> key_of(uint32_t slot) const;
  EvictionPolicy& policy() { return *policy_; }

  struct Placement {
    uint32_t slot;
    std::optional<Key> evicted;
  };
  // Gives non-resident key k a slot: the lowest empty one, else the policy's
  // victim (which is removed). nullopt when every resident key is protected.
  // A prefetch placement (prefetch = true) evicts only when the policy allows
  // the hint to displace the victim.
  std::optional<Placement> place(Key k, Phase phase, const ProtectedFn& is_protected,
                                 bool prefetch = false);
  // Takes k out (its load failed); its slot becomes empty.
  void remove(Key k);

 private:
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<std::optional<Key>> slot_key_;
  std::unordered_map<Key, uint32_t> key_slot_;
  std::set<uint32_t> empty_;
};

}  // namespace xpack::cache
