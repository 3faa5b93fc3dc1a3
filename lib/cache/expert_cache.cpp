#include "cache/expert_cache.h"

#include <algorithm>
#include <chrono>

#include <xxhash.h>

#include "common/checked_math.h"
#include "io/device_registrar.h"
#include "io/read_engine.h"
#include "stats/stats_json.h"

namespace xpack::cache {
namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// Device slots start at this alignment so kernels can use vector loads.
constexpr uint64_t kSlotAlignment = 256;

// Hash workers with verification on. One xxh3 of a 13.4 MB object takes about
// 1 ms, a read of it from the disk 6-7 ms: one worker keeps up with the disk,
// a second one keeps a burst of completions from queueing behind each other.
constexpr unsigned kHashWorkers = 2;

}  // namespace

ExpertCache::ExpertCache(ObjectSource src, device::Device& dev, const CacheOptions& opts)
    : src_(std::move(src)), dev_(dev), opts_(opts), telemetry_(src_.n_layers) {}

Result<std::unique_ptr<ExpertCache>> ExpertCache::create(ObjectSource source,
                                                         device::Device& device,
                                                         const CacheOptions& opts) {
  if (source.n_layers == 0 || source.n_experts == 0 || source.object_bytes == 0 ||
      !source.offset)
    return err(XPACK_E_INVALID_ARG, "cache: empty object source");
  if (source.read_bytes < source.object_bytes || source.read_bytes % 4096 != 0)
    return err(XPACK_E_MISALIGNED, "cache: read size {} must be a multiple of 4096 >= {}",
               source.read_bytes, source.object_bytes);
  if (opts.policy == PolicyKind::kBelady)
    return err(XPACK_E_INVALID_ARG, "cache: belady needs the future; it exists in xpack-sim only");
  if (opts.staging_slots == 0 || opts.staging_slots > 4096)
    return err(XPACK_E_INVALID_ARG, "cache: staging_slots must be 1..4096");
  if (opts.read_splits == 0 || opts.read_splits > 64)
    return err(XPACK_E_INVALID_ARG, "cache: read_splits must be 1..64");
  if (opts.verify && !source.checksum)
    return err(XPACK_E_INVALID_ARG, "cache: verification needs object checksums");
  std::unique_ptr<ExpertCache> c(new ExpertCache(std::move(source), device, opts));
  XPACK_TRY(c->init());
  return c;
}

Status ExpertCache::init() {
  // slots = floor(min(requested, free - reserve) / slot size)
  XPACK_ASSIGN_OR_RETURN(device::MemoryInfo mem, dev_.memory_info());
  uint64_t avail = mem.free_bytes > opts_.reserve_bytes ? mem.free_bytes - opts_.reserve_bytes : 0;
  uint64_t budget = opts_.budget_bytes ? std::min(opts_.budget_bytes, avail) : avail;
  slot_stride_ = align_up(src_.object_bytes, kSlotAlignment);
  uint64_t all_objects = uint64_t(src_.n_layers) * src_.n_experts;
  uint64_t slots = std::min<uint64_t>(budget / slot_stride_, all_objects);
  uint64_t need = std::max<uint32_t>(src_.top_k, 1);
  if (slots < need)
    return err(XPACK_E_CAPACITY,
               "cache: a budget of {} bytes (requested {}, free {}, reserve {}) holds {} slots of "
               "{} bytes, fewer than top-k = {}",
               budget, opts_.budget_bytes, mem.free_bytes, opts_.reserve_bytes, slots,
               slot_stride_, need);
  n_slots_ = uint32_t(std::min<uint64_t>(slots, UINT32_MAX));
  XPACK_ASSIGN_OR_RETURN(void* base, dev_.allocate(n_slots_ * slot_stride_));
  slots_base_ = static_cast<uint8_t*>(base);

  slots_.resize(n_slots_);
  for (auto& s : slots_) {
    XPACK_ASSIGN_OR_RETURN(s.ready, dev_.create_event());
  }
  dir_ = std::make_unique<SlotDirectory>(n_slots_, make_policy(opts_.policy));

  staging_.resize(opts_.staging_slots);
  for (auto& st : staging_) {
    XPACK_ASSIGN_OR_RETURN(st.copied, dev_.create_event());
  }
  registrar_ = std::make_unique<io::DeviceHostRegistrar>(dev_);
  io::EngineConfig ec;
  ec.paths = {src_.path};
  ec.slot_count = opts_.staging_slots;
  ec.slot_bytes = src_.read_bytes;
  ec.queue_depth = std::max<uint32_t>(opts_.queue_depth, 1);
  ec.read_splits = opts_.read_splits;
  ec.direct_io = opts_.direct_io;
  ec.registrar = registrar_.get();
  ec.faults = opts_.faults;
  ec.wakeable = true;
  ec.on_complete = [this](const io::Completion& c) { on_read_complete(c); };
  XPACK_ASSIGN_OR_RETURN(engine_, io::ReadEngine::create(std::move(ec)));
  telemetry_.update([&](stats::Counters& c) {
    c.staging_page_bytes = engine_->arena().page_bytes();
    c.staging_huge_fraction = engine_->arena().huge_fraction();
  });

  if (!opts_.trace_path.empty()) {
    XPACK_ASSIGN_OR_RETURN(trace_, stats::RoutingTraceWriter::open(opts_.trace_path));
  }
  hashing_.assign(staging_.size(), 0);
  if (opts_.verify)
    for (unsigned i = 0; i < kHashWorkers; ++i) hash_threads_.emplace_back([this] { hash_loop(); });
  io_thread_ = std::thread([this] { io_loop(); });
  return {};
}

ExpertCache::~ExpertCache() {
  if (io_thread_.joinable()) {
    bool sleeping;
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      sleeping = io_sleeping_;
    }
    notify_io(sleeping);
    io_thread_.join();
  }
  // After the I/O thread: the workers finish the hashes it queued, then leave.
  {
    std::lock_guard hl(hash_mu_);
    hash_stop_ = true;
  }
  hash_cv_.notify_all();
  for (auto& t : hash_threads_) t.join();
  (void)dev_.synchronize();
  if (engine_) (void)write_stats();
  if (trace_) (void)trace_->flush();
  engine_.reset();  // unregisters the staging arena before the registrar goes
  if (slots_base_) dev_.deallocate(slots_base_);
}

void* ExpertCache::slot_data(uint32_t slot) const {
  return slot < n_slots_ ? slots_base_ + uint64_t(slot) * slot_stride_ : nullptr;
}

bool ExpertCache::is_protected(Key k, bool for_demand) const {
  auto s = dir_->find(k);
  if (!s) return false;
  const Slot& slot = slots_[*s];
  // A slot whose read is in flight cannot be retargeted: the read would land
  // in it later. A prefetch that has not started is only a guess, which a
  // demand miss may overrule (but not another guess).
  if (slot.pins > 0) return true;
  if (slot.state != SlotState::kLoading) return false;
  return !(for_demand && slot.queued && slot.prefetched_unused);
}

void ExpertCache::notify_io(bool sleeping) {
  io_cv_.notify_one();
  if (sleeping) engine_->wake();
}

void ExpertCache::cancel_queued_prefetch(uint32_t slot) {
  if (!slots_[slot].queued) return;
  std::erase_if(pending_prefetch_, [slot](const LoadJob& j) { return j.slot == slot; });
  slots_[slot].queued = false;
}

void ExpertCache::promote_queued_prefetch(uint32_t slot) {
  if (!slots_[slot].queued) return;
  auto it = std::find_if(pending_prefetch_.begin(), pending_prefetch_.end(),
                         [slot](const LoadJob& j) { return j.slot == slot; });
  if (it == pending_prefetch_.end()) return;  // already a demand load
  pending_.push_back(*it);
  pending_prefetch_.erase(it);
}

uint64_t ExpertCache::expire_prefetches() {
  uint64_t expired = 0;
  std::erase_if(pending_prefetch_, [&](const LoadJob& j) {
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

void ExpertCache::start_load(uint32_t slot, Key k, bool prefetch) {
  Slot& s = slots_[slot];
  s.state = SlotState::kLoading;
  s.key = k;
  s.error = 0;
  s.prefetched_unused = prefetch;
  s.queued = true;
  (prefetch ? pending_prefetch_ : pending_).push_back(LoadJob{slot, k, now_ns(), step_});
}

ExpertCache::Take ExpertCache::take_key(Key k, Phase phase, TakeCounts& n,
                                       std::span<const Key> request) {
  EvictionPolicy& policy = dir_->policy();
  if (auto s = dir_->find(k)) {
    Slot& slot = slots_[*s];
    ++slot.pins;
    policy.on_hit(k);
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
  ++n.misses;
  if (placed->evicted) {
    ++n.evictions;
    if (slots_[placed->slot].prefetched_unused) ++n.wasted;
    cancel_queued_prefetch(placed->slot);
  }
  start_load(placed->slot, k, false);
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

ExpertHandle ExpertCache::handle_of(const Ticket& t, size_t index) const {
  const TicketKey& tk = t.keys[t.entry_key[index]];
  if (tk.slot == kNoSlot) return ExpertHandle{t.experts[index], kNoSlot, nullptr, nullptr, false};
  return ExpertHandle{t.experts[index], tk.slot, slot_data(tk.slot), slots_[tk.slot].ready.get(),
                      tk.hit};
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
        // Loads already started for this request go on (their entries become
        // ordinary unprotected ones), so they are counted as what they were.
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
      t.experts.push_back(experts[i]);
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
               t.experts[index], ticket);
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
                     t.experts[index], n_slots_);
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

void ExpertCache::unpin(Key k) {
  auto s = dir_->find(k);
  if (!s) return;
  Slot& slot = slots_[*s];
  if (slot.pins > 0) --slot.pins;
  if (slot.pins == 0 && slot.state == SlotState::kFailed) {
    dir_->remove(k);
    slot.state = SlotState::kEmpty;
  }
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
      start_load(placed->slot, k, true);
      slots_[placed->slot].pins = 0;
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

// ---- I/O thread --------------------------------------------------------------

void ExpertCache::fail_load(const LoadJob& job, int code) {
  {
    std::lock_guard lk(mu_);
    Slot& s = slots_[job.slot];
    bool wasted = s.prefetched_unused;
    // Counted before the state change is visible, so a waiter that sees the
    // failure also sees it counted.
    telemetry_.update([&](stats::Counters& c) {
      ++c.io_errors;
      if (wasted) ++c.prefetch_wasted;
    });
    s.error = code;
    s.state = SlotState::kFailed;
    s.prefetched_unused = false;
    if (s.pins == 0) {  // nobody waits: drop it now
      dir_->remove(job.key);
      s.state = SlotState::kEmpty;
      if (!deferred_tickets_.empty()) place_deferred();  // loads queue for this thread
    }
  }
  state_cv_.notify_all();
}

void ExpertCache::on_read_complete(const io::Completion& c) {
  Staging& st = staging_[c.slot];
  LoadJob job = st.job;
  uint64_t read_ns = now_ns() - job.queued_ns;
  int status = c.status;
  const uint8_t* staged = engine_->slot_data(c.slot);
  if (status == 0 && c.bytes < src_.object_bytes) status = XPACK_E_TRUNCATED;
  if (status == 0) {
    // Unverified, the slot's ready event follows the copy at once. Verified, only
    // the staging buffer's event does: the hash worker records the slot's event
    // after the hash matched, so even a compute stream waiting on that event never
    // sees bytes that were not checked.
    device::Event* slot_ready = slots_[job.slot].ready.get();
    Status cp = opts_.verify
                    ? dev_.copy_to_device_async(slot_data(job.slot), staged, src_.object_bytes, st.copied.get())
                    : dev_.copy_to_device_async(slot_data(job.slot), staged, src_.object_bytes, slot_ready);
    if (cp.ok() && !opts_.verify) cp = dev_.record(*st.copied);
    if (!cp.ok()) status = cp.error().code < 0 ? cp.error().code : XPACK_E_DEVICE;
  }
  if (status != 0) {
    st.busy = false;
    st.delivering = false;
    fail_load(job, status);
    return;
  }
  st.delivering = true;
  st.copy_done = false;
  st.copy_enqueued_ns = now_ns();
  const uint64_t fallback = engine_->counters().fallback_count;
  if (!opts_.verify) {
    publish(job, c.bytes, read_ns, fallback);
    return;
  }
  {
    std::lock_guard hl(hash_mu_);
    hashing_[c.slot] = 1;
    hash_jobs_.push_back(HashJob{c.slot, job, staged, src_.checksum(key_layer(job.key), key_expert(job.key)),
                                 c.bytes, read_ns, fallback});
  }
  hash_cv_.notify_one();
}

void ExpertCache::publish(const LoadJob& job, uint64_t bytes_read, uint64_t read_ns, uint64_t fallback) {
  telemetry_.update([&](stats::Counters& ct) {
    ++ct.pack_reads;
    ct.pack_read_bytes += bytes_read;
    ct.h2d_bytes += src_.object_bytes;
    ct.fallback_count = fallback;
    ct.read_latency.record(read_ns);
  });
  {
    std::lock_guard lk(mu_);
    slots_[job.slot].state = SlotState::kCopying;
    // An unpinned slot (a prefetch) just became evictable: a waiting request may take it.
    if (slots_[job.slot].pins == 0 && !deferred_tickets_.empty()) place_deferred();
  }
  state_cv_.notify_all();
}

// ---- hash workers --------------------------------------------------------------

void ExpertCache::check_hash(const HashJob& j) {
  int status = 0;
  if (XXH3_64bits(j.staged, src_.object_bytes) != j.expected) {
    status = XPACK_E_OBJECT_CHECKSUM;
  } else {
    // Recorded after the copy (one stream, FIFO), so it covers it.
    Status r = dev_.record(*slots_[j.job.slot].ready);
    if (!r.ok()) status = r.error().code < 0 ? r.error().code : XPACK_E_DEVICE;
  }
  // The slot stayed kLoading (protected, invisible to waiters) until here.
  if (status != 0)
    fail_load(j.job, status);
  else
    publish(j.job, j.bytes_read, j.read_ns, j.fallback);
}

void ExpertCache::hash_loop() {
  std::unique_lock hl(hash_mu_);
  for (;;) {
    hash_cv_.wait(hl, [&] { return hash_stop_ || !hash_jobs_.empty(); });
    if (hash_jobs_.empty()) return;  // stopping, and every queued hash is done
    HashJob j = hash_jobs_.front();
    hash_jobs_.pop_front();
    hl.unlock();
    check_hash(j);
    hl.lock();
    // Only now may the I/O thread hand the buffer out again (with its copy done).
    hashing_[j.staging] = 0;
    hash_done_cv_.notify_all();
    hl.unlock();
    // A freed buffer, or loads placed for deferred keys by publish/fail_load: the
    // I/O thread may be asleep in the kernel or on its condition variable.
    notify_io(true);
    hl.lock();
  }
}

bool ExpertCache::hash_pending(uint32_t staging) {
  std::lock_guard hl(hash_mu_);
  return hashing_[staging] != 0;
}

size_t ExpertCache::reap_staging(ReapWait how) {
  size_t freed = 0;
  auto copy_seen_done = [&](Staging& st) {
    telemetry_.update([&](stats::Counters& c) { c.h2d_latency.record(now_ns() - st.copy_enqueued_ns); });
    st.copy_done = true;
  };
  for (;;) {
    Staging* oldest_copy = nullptr;
    bool hashes = false;
    for (uint32_t i = 0; i < staging_.size(); ++i) {
      Staging& st = staging_[i];
      if (!st.delivering) continue;
      if (!st.copy_done) {
        auto done = st.copied->query();
        if (done.ok() && !*done) {
          if (!oldest_copy || st.copy_enqueued_ns < oldest_copy->copy_enqueued_ns) oldest_copy = &st;
          continue;
        }
        copy_seen_done(st);
      }
      if (hash_pending(i)) {
        hashes = true;
        continue;
      }
      st.delivering = false;
      st.copy_done = false;
      st.busy = false;
      ++freed;
    }
    if (freed > 0 || how == ReapWait::kNone) return freed;
    if (oldest_copy) {
      (void)oldest_copy->copied->wait();
      copy_seen_done(*oldest_copy);
      if (how == ReapWait::kCopy) how = ReapWait::kNone;  // collect it, then go
      continue;
    }
    if (!hashes || how != ReapWait::kOne) return freed;
    // Every delivered buffer waits for its hash only: wait for one to finish.
    std::unique_lock hl(hash_mu_);
    hash_done_cv_.wait(hl, [&] {
      for (uint32_t i = 0; i < staging_.size(); ++i)
        if (staging_[i].delivering && staging_[i].copy_done && !hashing_[i]) return true;
      return false;
    });
  }
}

void ExpertCache::io_loop() {
  std::vector<io::ReadRequest> batch;
  std::vector<io::Completion> unused;
  for (;;) {
    reap_staging(ReapWait::kNone);
    size_t free_staging = 0;
    for (auto& st : staging_) free_staging += !st.busy;
    bool want_more;
    uint64_t expired = 0;
    batch.clear();
    {
      std::unique_lock lk(mu_);
      auto has_work = [&] {
        return stop_ || !pending_.empty() || !pending_prefetch_.empty() ||
               engine_->objects_in_flight() > 0;
      };
      if (!has_work()) io_cv_.wait(lk, has_work);
      if (stop_ && pending_.empty() && pending_prefetch_.empty() &&
          engine_->objects_in_flight() == 0)
        break;
      expired = expire_prefetches();
      if (expired && !deferred_tickets_.empty() && place_deferred() > 0) state_cv_.notify_all();
      // Demand loads first; prefetches only use staging left over.
      uint32_t si = 0;
      auto take = [&](std::deque<LoadJob>& q) {
        while (!q.empty() && free_staging > 0) {
          while (staging_[si].busy) ++si;
          Staging& st = staging_[si];
          st.busy = true;
          st.job = q.front();
          q.pop_front();
          slots_[st.job.slot].queued = false;
          --free_staging;
          batch.push_back(io::ReadRequest{0, src_.offset(key_layer(st.job.key),
                                                         key_expert(st.job.key)),
                                          src_.read_bytes, si, st.job.key});
        }
      };
      take(pending_);
      take(pending_prefetch_);
      want_more = !pending_.empty() || !pending_prefetch_.empty();
    }
    if (expired) telemetry_.update([&](stats::Counters& c) { c.prefetch_wasted += expired; });
    if (!batch.empty()) {
      Status st = engine_->submit(batch);
      if (!st.ok()) {
        for (auto& r : batch) {
          staging_[r.slot].busy = false;
          fail_load(staging_[r.slot].job, st.error().code);
        }
      }
    }
    if (engine_->objects_in_flight() > 0) {
      auto got = engine_->poll(0, &unused);
      if (!got.ok() || *got > 0) continue;
      bool copying = std::any_of(staging_.begin(), staging_.end(),
                                 [](const Staging& st) { return st.delivering && !st.copy_done; });
      std::unique_lock lk(mu_);
      bool queued = !pending_.empty() || !pending_prefetch_.empty();
      if (queued && free_staging > 0) continue;  // arrived meanwhile: take it now
      if (queued && copying) {
        // A buffer frees within one H2D copy (~0.25 ms for 13 MB over PCIe);
        // waiting for the next read completion instead would leave a queued
        // load idle for a whole read interval.
        lk.unlock();
        reap_staging(ReapWait::kCopy);
        continue;
      }
      // Sleep in the kernel until a read completes, acquire()/prefetch() hands
      // over new work, or a hash worker frees a buffer (engine wake-up): no
      // polling interval.
      io_sleeping_ = true;
      lk.unlock();
      (void)engine_->poll(-1, &unused);
      lk.lock();
      io_sleeping_ = false;
    } else if (want_more) {
      reap_staging(ReapWait::kOne);  // every staging buffer is being delivered
    }
  }
}

Status ExpertCache::write_stats() {
  Status trace_status;
  if (trace_) {
    trace_status = trace_->flush();
    if (!trace_status.ok())
      telemetry_.update([](stats::Counters& c) { ++c.trace_write_errors; });
  }
  if (opts_.stats_path.empty()) return trace_status;
  auto c = telemetry_.snapshot();
  auto j = stats::counters_to_json(c);
  {
    std::lock_guard lk(mu_);
    j["resident_experts"] = dir_->resident_count();
    j["resident_bytes"] = uint64_t(dir_->resident_count()) * src_.object_bytes;
  }
  j["pack_path"] = src_.path;
  j["cache_policy"] = policy_name(opts_.policy);
  j["cache_capacity_experts"] = n_slots_;
  j["cache_capacity_bytes"] = uint64_t(n_slots_) * slot_stride_;
  j["object_bytes"] = src_.object_bytes;
  j["staging_slots"] = opts_.staging_slots;
  j["staged_bytes"] = uint64_t(opts_.staging_slots) * src_.read_bytes;
  j["read_splits"] = opts_.read_splits;
  j["direct_io"] = opts_.direct_io;
  j["verify"] = opts_.verify;
  j["device_backend"] = dev_.backend_name();
  std::lock_guard lk(stats_write_mu_);
  XPACK_TRY(stats::write_file_atomic(opts_.stats_path, j.dump(2) + "\n"));
  return trace_status;
}

}  // namespace xpack::cache
