// Prefetch hints: loads at low priority that are only guesses until acquired.
#include "cache/expert_cache.h"

#include <algorithm>

namespace xpack::cache {

Result<size_t> ExpertCache::prefetch(uint32_t layer, const uint32_t* experts, size_t n) {
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
    // Requests waiting for slots come before guesses.
    if (!deferred_tickets_.empty()) return size_t{0};
    auto protect = [this](Key k) { return is_protected(k, /*for_demand=*/false); };
    for (size_t i = 0; i < n; ++i) {
      Key k = make_key(layer, experts[i]);
      if (dir_->find(k)) continue;
      auto placed = dir_->place(k, Phase::kDecode, protect, /*prefetch=*/true);
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
    ++expired;
    return true;
  });
  return expired;
}

}  // namespace xpack::cache
