// Which key occupies which slot, and the eviction decision. Shared by the
// runtime cache and xpack-sim so that the simulator replays exactly the
// runtime's placement rules: the first empty slot (lowest index) first, then
// the policy's victim among unprotected keys. A prefill's victim is taken from
// the keys no decode step has used first (the decode working set is kept; a
// prompt streams through the slots its own experts took), and from the others
// only when none of those can go. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/policy.h"

namespace xpack::cache {

class SlotDirectory {
 public:
  // protect_decode = false: a prefill takes the policy's victim like decode does
  // (for measuring what the protection is worth: xpack-sim --no-decode-protection).
  SlotDirectory(uint32_t n_slots, std::unique_ptr<EvictionPolicy> policy, bool protect_decode = true);

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
  // A demand request of `phase` used resident key k (a hit, or k's own
  // placement): a decode use puts k in the decode working set until it leaves.
  void note_use(Key k, Phase phase);
  bool decode_used(Key k) const { return decode_used_.count(k) != 0; }

 private:
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<std::optional<Key>> slot_key_;
  std::unordered_map<Key, uint32_t> key_slot_;
  std::set<uint32_t> empty_;
  std::unordered_set<Key> decode_used_;  // resident keys a decode step used
  bool protect_decode_;
};

}  // namespace xpack::cache
