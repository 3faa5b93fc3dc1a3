// The request calls: acquire, the entries' handles, wait and release.
#include "cache/expert_cache.h"

#include <algorithm>

#include "cache/cache_clock.h"

namespace xpack::cache {

Result<Acquired> ExpertCache::acquire(uint32_t layer, const uint32_t* experts, size_t n,
                                      uint32_t n_tokens, bool defer) {
  if (layer >= src_.n_layers)
    return err(XPACK_E_INVALID_ARG, "acquire: layer {} out of range ({} layers)", layer,
               src_.n_layers);
  if (n == 0 || !experts) return err(XPACK_E_INVALID_ARG, "acquire: no experts");
  std::vector<Key> keys;
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (experts[i] >= src_.n_experts)
      return err(XPACK_E_INVALID_ARG, "acquire: expert {} out of range ({} experts)", experts[i],
                 src_.n_experts);
    keys.push_back(make_key(layer, experts[i]));
  }
  if (defer) {
    // Placed in the caller's order, so the entries it will use first load first.
    std::vector<Key> ordered;
    ordered.reserve(keys.size());
    for (Key k : keys)
      if (std::find(ordered.begin(), ordered.end(), k) == ordered.end()) ordered.push_back(k);
    keys = std::move(ordered);
  } else {
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    if (keys.size() > n_slots_)
      return err(XPACK_E_CAPACITY,
                 "acquire: {} distinct experts, cache has {} slots (acquire with defer to load "
                 "them in turns)",
                 keys.size(), n_slots_);
  }
  Phase phase = n_tokens > 1 ? Phase::kPrefill : Phase::kDecode;

  Acquired out;
  TakeCounts counts;
  bool io_sleeping = false;
  {
    std::unique_lock lk(mu_);
    if (int64_t(layer) <= last_layer_) ++step_;
    last_layer_ = layer;
    // A full disk must not stop inference, but the trace is then incomplete:
    // counted, and reported by write_stats().
    if (trace_ && !trace_->write(step_, layer, experts, n).ok())
      telemetry_.update([](stats::Counters& c) { ++c.trace_write_errors; });

    for (Key k : keys) dir_->policy().on_request(k);
    Ticket t;
    t.layer = layer;
    t.phase = phase;
    t.keys.reserve(keys.size());
    // A later request waits behind deferred ones instead of taking the slots
    // they are waiting for. A deferred request takes its slots strictly in
    // order: pinning a later expert while an earlier one waits could leave
    // every slot held by requests that wait for each other (or for
    // themselves), and no release would ever come.
    bool deferring = defer && !deferred_tickets_.empty();
    std::vector<Key> request = keys;
    std::sort(request.begin(), request.end());
    for (Key k : keys) {
      TicketKey tk;
      tk.key = k;
      Take got{kNoSlot, false, false};
      if (!deferring) {
        got = take_key(k, phase, counts, request);
        // Wider than the free slots: its own later experts give way (as in
        // place_deferred, a preference is never waited for).
        if (!got.placed && defer) got = take_key(k, phase, counts);
      }
      if (!got.placed) {
        if (defer) {
          deferring = true;
          tk.deferred = true;
          ++t.deferred;
          t.keys.push_back(tk);
          continue;
        }
        for (const TicketKey& p : t.keys) unpin(p.key);
        // Loads already started for this request go on (their keys stay resident,
        // unprotected), so they are counted as what they were.
        count_takes(layer, counts);
        // The pins just dropped may be what a deferred request waits for.
        bool waiting = !deferred_tickets_.empty();
        size_t started = waiting ? place_deferred() : 0;
        bool sleeping = io_sleeping_;
        lk.unlock();
        if (counts.misses || started) notify_io(sleeping);
        if (waiting) state_cv_.notify_all();
        return err(XPACK_E_CAPACITY,
                   "acquire: no evictable slot for layer {} expert {} (all {} slots protected)",
                   layer, key_expert(k), n_slots_);
      }
      tk.slot = got.slot;
      tk.hit = got.hit;
      tk.pinned = true;
      t.keys.push_back(tk);
    }
    for (size_t i = 0; i < n; ++i) {
      Key k = make_key(layer, experts[i]);
      size_t ki = 0;
      while (t.keys[ki].key != k) ++ki;
      t.entry_key.push_back(uint32_t(ki));
      t.entry_expert.push_back(experts[i]);
    }
    TicketId id = next_ticket_++;
    out.ticket = id;
    out.experts.reserve(n);
    for (size_t i = 0; i < n; ++i) out.experts.push_back(handle_of(t, i));
    if (t.deferred) deferred_tickets_.insert(id);
    tickets_.emplace(id, std::move(t));
    count_takes(layer, counts);
    io_sleeping = io_sleeping_;
  }
  if (counts.misses) notify_io(io_sleeping);
  telemetry_.update([&](stats::Counters& c) {
    ++c.acquires;
    ++c.route_calls_by_layer[layer];
    c.route_tokens_by_layer[layer] += n_tokens;
  });
  return out;
}

ExpertHandle ExpertCache::handle_of(const Ticket& t, size_t index) const {
  const TicketKey& tk = t.keys[t.entry_key[index]];
  if (tk.slot == kNoSlot) return ExpertHandle{t.entry_expert[index], kNoSlot, nullptr, nullptr, false, false};
  const Slot& s = slots_[tk.slot];
  // kCopying: published, its copy enqueued before the ready event was recorded.
  return ExpertHandle{t.entry_expert[index], tk.slot, slot_data(tk.slot), s.ready.get(), tk.hit,
                      s.state == SlotState::kCopying};
}

Result<ExpertHandle> ExpertCache::entry(TicketId ticket, size_t index) const {
  std::lock_guard lk(mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return err(XPACK_E_INVALID_ARG, "entry: unknown ticket {}", ticket);
  if (index >= it->second.entry_key.size())
    return err(XPACK_E_INVALID_ARG, "entry: index {} out of range", index);
  return handle_of(it->second, index);
}

Result<ExpertCache::LiveEntry> ExpertCache::live_entry(std::string_view op, TicketId ticket,
                                                      size_t index) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end())
    return err(XPACK_E_INVALID_ARG, "{}: unknown or already released ticket {}", op, ticket);
  Ticket& t = it->second;
  if (index >= t.entry_key.size())
    return err(XPACK_E_INVALID_ARG, "{}: index {} out of range", op, index);
  TicketKey& tk = t.keys[t.entry_key[index]];
  if (tk.done)
    return err(XPACK_E_INVALID_ARG, "{}: expert {} of ticket {} was already released", op,
               t.entry_expert[index], ticket);
  return LiveEntry{&t, &tk};
}

Status ExpertCache::wait(TicketId ticket, size_t index) {
  uint64_t t0 = 0;
  device::Event* ev = nullptr;
  {
    std::unique_lock lk(mu_);
    auto e = live_entry("wait", ticket, index);
    if (!e.ok()) return std::move(e).error();
    Ticket& t = *e->ticket;
    TicketKey& tk = *e->key;
    if (tk.deferred) {
      t0 = now_ns();
      for (;;) {
        if (!tk.deferred) break;
        size_t held = std::count_if(t.keys.begin(), t.keys.end(),
                                    [](const TicketKey& x) { return x.pinned; });
        // Only this request could free a slot, and it is waiting: it must
        // release experts it is done with first.
        if (held >= n_slots_)
          return err(XPACK_E_CAPACITY,
                     "wait: expert {} waits for a slot, and all {} slots hold experts of the same "
                     "request: release_expert() those already used first",
                     t.entry_expert[index], n_slots_);
        state_cv_.wait(lk);
      }
    }
    Slot& s = slots_[tk.slot];
    if (s.state == SlotState::kLoading) {
      if (!t0) t0 = now_ns();
      state_cv_.wait(lk, [&] { return s.state != SlotState::kLoading; });
    }
    if (s.state == SlotState::kFailed) {
      return err(s.error, "expert {} of layer {} failed to load: {}", key_expert(s.key),
                 key_layer(s.key), xpack_strerror(s.error));
    }
    ev = s.ready.get();
  }
  auto done = ev->query();
  if (!done.ok()) return std::move(done).error();
  if (!*done) {
    if (!t0) t0 = now_ns();
    XPACK_TRY(ev->wait());
  }
  if (t0) {
    uint64_t dt = now_ns() - t0;
    telemetry_.update([&](stats::Counters& c) {
      c.stall_ns += dt;
      ++c.stall_waits;
    });
  }
  return {};
}

Status ExpertCache::wait_all(TicketId ticket) {
  size_t n;
  {
    std::lock_guard lk(mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return err(XPACK_E_INVALID_ARG, "wait: unknown ticket {}", ticket);
    n = it->second.entry_key.size();
  }
  Status first;
  for (size_t i = 0; i < n; ++i) {
    Status st = wait(ticket, i);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status ExpertCache::release(TicketId ticket, void* compute_stream) {
  if (compute_stream) XPACK_TRY(dev_.order_after(compute_stream));
  uint64_t steps = 0;
  {
    std::unique_lock lk(mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end())
      return err(XPACK_E_INVALID_ARG, "release: unknown or already released ticket {}", ticket);
    for (const TicketKey& tk : it->second.keys)
      if (tk.pinned) unpin(tk.key);
    deferred_tickets_.erase(ticket);
    tickets_.erase(it);
    after_unpin(lk);
  }
  telemetry_.update([&](stats::Counters& c) { steps = ++c.steps; });
  if (opts_.stats_interval && steps % opts_.stats_interval == 0) XPACK_TRY(write_stats());
  return {};
}

Status ExpertCache::release_expert(TicketId ticket, size_t index, void* compute_stream) {
  if (compute_stream) XPACK_TRY(dev_.order_after(compute_stream));
  std::unique_lock lk(mu_);
  auto e = live_entry("release_expert", ticket, index);
  if (!e.ok()) return std::move(e).error();
  Ticket& t = *e->ticket;
  TicketKey& tk = *e->key;
  tk.done = true;
  if (tk.deferred) {  // never loaded for this request: it just leaves the queue
    tk.deferred = false;
    if (--t.deferred == 0) deferred_tickets_.erase(ticket);
  }
  if (tk.pinned) {
    tk.pinned = false;
    unpin(tk.key);
  }
  after_unpin(lk);
  return {};
}

}  // namespace xpack::cache
