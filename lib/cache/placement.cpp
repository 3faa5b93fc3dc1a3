// Giving keys device slots: pins, protection, starting a load, and placing the
// keys of deferred requests as slots free. Everything here runs under mu_.
#include "cache/expert_cache.h"

#include <algorithm>

#include "cache/cache_clock.h"

namespace xpack::cache {

bool ExpertCache::is_protected(Key k, bool for_demand) const {
  auto s = dir_->find(k);
  if (!s) return false;
  const Slot& slot = slots_[*s];
  // A slot whose read is in flight cannot be retargeted: the read would land
  // in it later. A prefetch that has not started is only a guess, which a
  // demand miss may overrule (but not another guess).
  if (slot.pins > 0 || held_hint(slot)) return true;
  if (slot.state != SlotState::kLoading) return false;
  return !(for_demand && slot.queued && slot.prefetched_unused);
}

void ExpertCache::start_load(uint32_t slot, Key k, bool prefetch) {
  Slot& s = slots_[slot];
  s.state = SlotState::kLoading;
  s.key = k;
  s.error = 0;
  s.prefetched_unused = prefetch;
  s.certain = false;
  s.queued = true;
  (prefetch ? prefetch_loads_ : demand_loads_).push_back(LoadJob{slot, k, now_ns(), step_});
}

ExpertCache::Take ExpertCache::take_key(Key k, Phase phase, TakeCounts& n,
                                       std::span<const Key> request) {
  EvictionPolicy& policy = dir_->policy();
  if (auto s = dir_->find(k)) {
    Slot& slot = slots_[*s];
    ++slot.pins;
    slot.certain = false;  // acquired: its pins protect it from here
    policy.on_hit(k);
    dir_->note_use(k, phase);
    // A failed load keeps its slot until its holders release it; this request
    // sees the same failure in wait().
    ++n.hits;
    if (slot.prefetched_unused) {
      promote_queued_prefetch(*s);
      slot.prefetched_unused = false;
      ++n.used;
    }
    return {*s, true, true};
  }
  // The rest of the same request is protected too, resident or not yet pinned
  // (as xpack-sim replays it): evicting an expert it is about to hit would only
  // cost another read.
  auto protect = [&](Key key) {
    return is_protected(key, /*for_demand=*/true) ||
           std::binary_search(request.begin(), request.end(), key);
  };
  auto placed = dir_->place(k, phase, protect);
  if (!placed) return {kNoSlot, false, false};
  dir_->note_use(k, phase);
  ++n.misses;
  if (placed->evicted) {
    ++n.evictions;
    if (slots_[placed->slot].prefetched_unused) ++n.wasted;
    cancel_queued_prefetch(placed->slot);
  }
  fill_slot(placed->slot, k, placed->evicted.has_value(), false);
  slots_[placed->slot].pins = 1;
  return {placed->slot, false, true};
}

void ExpertCache::count_takes(uint32_t layer, const TakeCounts& n) {
  if (!n.hits && !n.misses && !n.evictions && !n.used && !n.wasted) return;
  telemetry_.update([&](stats::Counters& c) {
    c.cache_hits += n.hits;
    c.cache_misses += n.misses;
    c.cache_evictions += n.evictions;
    c.prefetch_used += n.used;
    c.prefetch_wasted += n.wasted;
    c.hits_by_layer[layer] += n.hits;
    c.misses_by_layer[layer] += n.misses;
  });
}

void ExpertCache::unpin(Key k) {
  auto s = dir_->find(k);
  if (!s) return;
  Slot& slot = slots_[*s];
  if (slot.pins > 0) --slot.pins;
  if (slot.pins == 0 && slot.state == SlotState::kFailed) {
    dir_->remove(k);
    slot.state = SlotState::kEmpty;
    slot.certain = false;
  }
}

size_t ExpertCache::place_deferred() {
  // Experts that waiting requests will still use are kept while another slot
  // can be had: evicting one only means reading it again later. Never waited
  // for, though: which thread would release a slot instead is unknown.
  std::vector<Key> to_come;
  for (TicketId id : deferred_tickets_)
    for (const TicketKey& tk : tickets_.at(id).keys)
      if (tk.deferred) to_come.push_back(tk.key);
  std::sort(to_come.begin(), to_come.end());
  size_t started = 0;
  for (auto it = deferred_tickets_.begin(); it != deferred_tickets_.end();) {
    Ticket& t = tickets_.at(*it);
    TakeCounts n;
    bool blocked = false;
    for (TicketKey& tk : t.keys) {
      if (!tk.deferred) continue;
      Take got = take_key(tk.key, t.phase, n, to_come);
      if (!got.placed) got = take_key(tk.key, t.phase, n);
      if (!got.placed) {
        blocked = true;
        break;
      }
      tk.slot = got.slot;
      tk.hit = got.hit;
      tk.deferred = false;
      tk.pinned = true;
      --t.deferred;
    }
    count_takes(t.layer, n);
    started += n.misses;
    if (t.deferred == 0)
      it = deferred_tickets_.erase(it);
    else
      ++it;
    // First come, first served: a later request does not overtake this one.
    if (blocked) break;
  }
  return started;
}

void ExpertCache::after_unpin(std::unique_lock<std::mutex>& lk) {
  size_t started = deferred_tickets_.empty() ? 0 : place_deferred();
  bool sleeping = io_sleeping_;
  lk.unlock();
  if (started) notify_io(sleeping);
  state_cv_.notify_all();  // waiters of entries that just got a slot
}

}  // namespace xpack::cache
