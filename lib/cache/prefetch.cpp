// Prefetch hints: loads at low priority that are only guesses until acquired.
#include "cache/expert_cache.h"

#include <algorithm>

namespace xpack::cache {

Result<size_t> ExpertCache::prefetch(uint32_t layer, const uint32_t* experts, size_t n, bool certain) {
  if (layer >= src_.n_layers)
    return err(XPACK_E_INVALID_ARG, "prefetch: layer {} out of range", layer);
  if (n && !experts) return err(XPACK_E_INVALID_ARG, "prefetch: null expert list");
  for (size_t i = 0; i < n; ++i)
    if (experts[i] >= src_.n_experts)
      return err(XPACK_E_INVALID_ARG, "prefetch: expert {} out of range", experts[i]);
  size_t started = 0;
  uint64_t evictions = 0, wasted = 0;
  bool io_sleeping = false;
  {
    std::lock_guard lk(mu_);
    // Requests waiting for slots come before any hint.
    if (!deferred_tickets_.empty()) return size_t{0};
    std::vector<Key> hinted;  // a certain hint's own keys: placing one must not evict another
    size_t held = 0;
    if (certain) {
      for (size_t i = 0; i < n; ++i) hinted.push_back(make_key(layer, experts[i]));
      std::sort(hinted.begin(), hinted.end());
      for (const Slot& s : slots_) held += s.state != SlotState::kEmpty && held_hint(s);
    }
    const size_t max_held = n_slots_ / 2;
    auto protect = [&](Key k) {
      return is_protected(k, /*for_demand=*/false) || std::binary_search(hinted.begin(), hinted.end(), k);
    };
    auto hold = [&](Slot& s) {
      if (!held_hint(s)) ++held;
      s.certain = true;
      s.hint_step = step_;
    };
    for (size_t i = 0; i < n; ++i) {
      Key k = make_key(layer, experts[i]);
      if (auto resident = dir_->find(k)) {
        if (certain && held < max_held) hold(slots_[*resident]);
        continue;
      }
      if (certain && held >= max_held) continue;
      auto placed = dir_->place(k, Phase::kDecode, protect, /*prefetch=*/!certain);
      if (!placed) continue;  // nothing the hint may displace
      if (placed->evicted) {
        ++evictions;
        if (slots_[placed->slot].prefetched_unused) ++wasted;
        cancel_queued_prefetch(placed->slot);
      }
      fill_slot(placed->slot, k, placed->evicted.has_value(), true);
      slots_[placed->slot].pins = 0;
      if (slots_[placed->slot].state == SlotState::kFailed) {  // its copy could not be enqueued
        dir_->remove(k);
        slots_[placed->slot].state = SlotState::kEmpty;
        continue;
      }
      if (certain) hold(slots_[placed->slot]);
      ++started;
    }
    io_sleeping = io_sleeping_;
  }
  if (started) notify_io(io_sleeping);
  telemetry_.update([&](stats::Counters& c) {
    c.prefetch_issued += started;
    c.cache_evictions += evictions;
    c.prefetch_wasted += wasted;
  });
  return started;
}

void ExpertCache::cancel_queued_prefetch(uint32_t slot) {
  if (!slots_[slot].queued) return;
  std::erase_if(prefetch_loads_, [slot](const LoadJob& j) { return j.slot == slot; });
  slots_[slot].queued = false;
}

void ExpertCache::promote_queued_prefetch(uint32_t slot) {
  if (!slots_[slot].queued) return;
  auto it = std::find_if(prefetch_loads_.begin(), prefetch_loads_.end(),
                         [slot](const LoadJob& j) { return j.slot == slot; });
  if (it == prefetch_loads_.end()) return;  // already a demand load
  demand_loads_.push_back(*it);
  prefetch_loads_.erase(it);
}

uint64_t ExpertCache::expire_prefetches() {
  uint64_t expired = 0;
  std::erase_if(prefetch_loads_, [&](const LoadJob& j) {
    Slot& s = slots_[j.slot];
    if (j.step + 1 >= step_ || s.pins > 0 || !s.prefetched_unused) return false;
    dir_->remove(j.key);
    s.state = SlotState::kEmpty;
    s.queued = false;
    s.prefetched_unused = false;
    s.certain = false;
    ++expired;
    return true;
  });
  return expired;
}

}  // namespace xpack::cache
