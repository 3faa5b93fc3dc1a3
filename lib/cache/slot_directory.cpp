#include "cache/slot_directory.h"

namespace xpack::cache {

SlotDirectory::SlotDirectory(uint32_t n_slots, std::unique_ptr<EvictionPolicy> policy, bool protect_decode)
    : policy_(std::move(policy)), slot_key_(n_slots), protect_decode_(protect_decode) {
  for (uint32_t s = 0; s < n_slots; ++s) empty_.insert(empty_.end(), s);
}

std::optional<uint32_t> SlotDirectory::find(Key k) const {
  auto it = key_slot_.find(k);
  if (it == key_slot_.end()) return std::nullopt;
  return it->second;
}

std::optional<Key> SlotDirectory::key_of(uint32_t slot) const {
  if (slot >= slot_key_.size()) return std::nullopt;
  return slot_key_[slot];
}

std::optional<SlotDirectory::Placement> SlotDirectory::place(Key k, Phase phase,
                                                             const ProtectedFn& is_protected,
                                                             bool prefetch) {
  Placement p{};
  if (!empty_.empty()) {
    p.slot = *empty_.begin();
    empty_.erase(empty_.begin());
  } else {
    std::optional<Key> victim;
    if (phase == Phase::kPrefill && protect_decode_ && !decode_used_.empty()) {
      victim = policy_->choose_victim([&](Key v) { return is_protected(v) || decode_used_.count(v) != 0; }, phase);
    }
    if (!victim) victim = policy_->choose_victim(is_protected, phase);
    if (!victim) return std::nullopt;
    if (prefetch && !policy_->prefetch_may_displace(k, *victim)) return std::nullopt;
    p.slot = key_slot_.at(*victim);
    p.evicted = *victim;
    key_slot_.erase(*victim);
    decode_used_.erase(*victim);
    policy_->on_remove(*victim);
  }
  slot_key_[p.slot] = k;
  key_slot_[k] = p.slot;
  policy_->on_insert(k);
  return p;
}

void SlotDirectory::remove(Key k) {
  auto it = key_slot_.find(k);
  if (it == key_slot_.end()) return;
  slot_key_[it->second].reset();
  empty_.insert(it->second);
  key_slot_.erase(it);
  decode_used_.erase(k);
  policy_->on_remove(k);
}

void SlotDirectory::note_use(Key k, Phase phase) {
  if (phase == Phase::kDecode && key_slot_.count(k)) decode_used_.insert(k);
}

}  // namespace xpack::cache
