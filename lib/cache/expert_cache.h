// The expert cache: a byte-budgeted set of device slots, each holding one whole
// expert object, filled from the pack by the I/O engine.
//
// acquire() returns at once: hits are ready immediately; misses get a slot (an
// empty one first, else the policy's victim among unprotected resident keys) and are
// handed to the I/O thread in one batch. The I/O thread owns the read engine (it
// is single-issuer); as each object lands in staging it enqueues the H2D copy into
// the slot and records the slot's ready event, so the caller can compute with the
// hits while misses load and wait per expert. With verification the copy still
// starts at the read's completion, while a hash worker checks the same staged
// bytes beside it: the slot's ready event is recorded, and the slot published,
// only once the copy is enqueued AND the hash matched. A staging buffer is reused
// only after its copy's event completed and its hash (if any) finished. A slot
// whose read or verification failed is never published: waiters get the error,
// and its key is dropped on release.
//
// Experts of an acquire stay protected (never evicted) until release(), or one by
// one through release_expert(). With `defer`, an acquire may name more distinct
// experts than can be placed now: those get no slot yet (kNoSlot) and are placed,
// in request order and first come first served across requests, as slots are
// released; the caller waits for them like any miss and reads their handle with
// entry(). That streams a prefill wider than the cache without copying anything
// out of the slots: wait(i), compute, release_expert(i), next. Prefetch
// loads into free slots or over resident keys the policy ranks no higher than the hint.
// A prefetch still waiting for a staging buffer is only a guess: it protects
// nothing (a demand miss may take its slot, cancelling it), it is promoted to a
// demand load when acquired, and it is dropped if not started within one step.
// The I/O thread sleeps in the kernel while reads are in flight; new work wakes
// it at once through the engine's eventfd.
//
// With a host tier (host_cache_bytes, host_tier.h) a device eviction of a loaded
// expert copies it device->host into a frame, and a miss on a key the tier
// holds is filled by one host->device copy from its frame instead of a read:
// both enqueued under mu_ on the device's one copy stream, whose order alone
// keeps a slot's bytes from being overwritten before they were copied out.
//
// Names (doc/cache.md, "Glossary"): a *slot* is a device slot only; a *staging
// buffer* (its index: a *stage*) is what the engine calls a slot; an *entry* is
// one requested id of an acquire (index i: one token's k-th routed expert); a
// *key* is one (layer, expert), where the layer is an object-table row.
//
// The class is implemented by job: expert_cache.cpp (create and destroy),
// sizing.cpp (option checks, slot count), tickets.cpp (acquire, wait, release),
// placement.cpp (pins, protection, deferred keys), prefetch.cpp, io_loop.cpp (the
// I/O thread), delivery.cpp (completion, checksum, H2D, publish), tiering.cpp
// (demotion to and promotion from the host tier) and cache_stats.cpp (the stats JSON).
//
// Thread-safety: every public method is thread-safe; several threads may acquire,
// wait and release concurrently. A ticket must be released exactly once, and its
// handles are valid until then.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/cache_options.h"
#include "cache/host_tier.h"
#include "cache/object_source.h"
#include "cache/policy.h"
#include "cache/slot_directory.h"
#include "common/result.h"
#include "device/device.h"
#include "stats/counters.h"
#include "stats/routing_trace.h"

namespace xpack::io {
class ReadEngine;
struct Completion;
class DeviceHostRegistrar;
}  // namespace xpack::io

namespace xpack::cache {

using TicketId = uint64_t;

inline constexpr uint32_t kNoSlot = UINT32_MAX;  // a deferred entry, no device slot yet

struct ExpertHandle {
  uint32_t expert = 0;
  uint32_t slot = 0;                 // kNoSlot while deferred
  void* data = nullptr;              // device address of the object
  device::Event* ready = nullptr;    // complete once the object is in the slot
  bool hit = false;
  // `ready` is recorded for this object (its copy is enqueued): a stream may
  // wait on it. A hit on an expert still being read is a hit without it.
  bool ready_recorded = false;
};

struct Acquired {
  TicketId ticket = 0;
  std::vector<ExpertHandle> experts;  // in the order requested
};

class ExpertCache {
 public:
  // `device` must outlive the cache.
  static Result<std::unique_ptr<ExpertCache>> create(ObjectSource source, device::Device& device,
                                                     const CacheOptions& opts);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // n expert ids of one layer for n_tokens tokens (duplicates allowed: one entry
  // per id, sharing the slot). n_tokens > 1 marks a prefill request.
  // XPACK_E_INVALID_ARG for a bad layer/expert/n; XPACK_E_CAPACITY when the
  // distinct experts cannot all be placed because too many slots are protected,
  // unless `defer` (then the rest are deferred, see above).
  Result<Acquired> acquire(uint32_t layer, const uint32_t* experts, size_t n,
                           uint32_t n_tokens = 1, bool defer = false);
  // Blocks until expert `index` of the ticket is in its slot, or returns the
  // error of its load (its slot is then not published). For a deferred entry it
  // first waits for a slot; XPACK_E_CAPACITY if every slot holds experts of this
  // same ticket (only its own release_expert could make room).
  Status wait(TicketId ticket, size_t index);
  // The entry's handle now (its slot once a deferred entry was placed).
  Result<ExpertHandle> entry(TicketId ticket, size_t index) const;
  // Ends the protection of one expert of the ticket (every entry naming the
  // same expert); its handle is invalid after. Deferred entries waiting for it
  // may take the slot. The ticket must still be released.
  Status release_expert(TicketId ticket, size_t index, void* compute_stream = nullptr);
  // Waits for all; returns the first error but waits for every expert.
  Status wait_all(TicketId ticket);
  // Ends the protection of the ticket's experts. `compute_stream` (may be null):
  // the stream whose work reads the slots; later copies are ordered after it.
  Status release(TicketId ticket, void* compute_stream = nullptr);
  // Starts loads of the listed experts that are not resident, at lower priority
  // than demand loads. A guess takes only free slots or resident keys the policy
  // values no more. A certain hint (the caller knows that this step or the next
  // acquires them: deepseek4's hash-routed layers at token time) is placed as a
  // demand miss is, over the policy's victim: a policy that values a key by its
  // history would otherwise refuse every expert it has not seen yet. Each of its
  // experts, loading or resident, is then protected until acquired or until the
  // step after next starts, and certain hints hold at most half the slots at
  // once, so demand always has the other half to stream through. Returns how
  // many loads it started.
  Result<size_t> prefetch(uint32_t layer, const uint32_t* experts, size_t n, bool certain = false);

  // Includes the SSD busy time of a stretch of reads still in flight.
  stats::Counters counters() const;
  // Writes the stats JSON now (no-op without a stats path) and flushes the
  // routing trace; returns the first error.
  Status write_stats();

  uint32_t slot_count() const { return n_slots_; }
  uint32_t host_frame_count() const { return host_ ? host_->frame_count() : 0; }
  uint64_t host_frame_stride() const { return frame_stride_; }
  uint64_t slot_stride() const { return slot_stride_; }
  uint64_t object_bytes() const { return src_.object_bytes; }
  void* slot_data(uint32_t slot) const;
  const ObjectSource& source() const { return src_; }
  PolicyKind policy() const { return opts_.policy; }

 private:
  // ---- device slots and tickets (under mu_) ----
  enum class SlotState : uint8_t { kEmpty, kLoading, kCopying, kFailed };
  struct Slot {
    SlotState state = SlotState::kEmpty;
    Key key = 0;
    uint32_t pins = 0;
    int error = 0;
    bool prefetched_unused = false;
    bool queued = false;  // its load waits for a staging buffer (not read yet)
    bool certain = false;     // named by a certain hint not acquired since (held_hint)
    uint64_t hint_step = 0;   // step_ when that hint came
    std::unique_ptr<device::Event> ready;
  };
  struct LoadJob {
    uint32_t slot;
    Key key;
    uint64_t queued_ns;
    uint64_t step;
  };
  struct TicketKey {
    Key key = 0;
    uint32_t slot = kNoSlot;
    bool pinned = false;    // holds one pin on slot
    bool deferred = false;  // waits for a slot
    bool done = false;      // released early by release_expert
    bool hit = false;
  };
  struct Ticket {
    uint32_t layer = 0;
    Phase phase = Phase::kDecode;
    std::vector<TicketKey> keys;        // distinct
    std::vector<uint32_t> entry_key;    // per entry: index into keys
    std::vector<uint32_t> entry_expert; // per entry: the expert requested
    size_t deferred = 0;                // keys still waiting for a slot
  };
  struct TakeCounts {
    uint64_t hits = 0, misses = 0, evictions = 0, used = 0, wasted = 0;
  };
  struct Take {
    uint32_t slot;
    bool hit;
    bool placed;
  };
  struct LiveEntry {
    Ticket* ticket;
    TicketKey* key;
  };

  // ---- staging buffers and hashes (I/O thread, hash workers) ----
  struct StagingBuffer {
    bool busy = false;           // read in flight, or its bytes still being delivered
    bool delivering = false;     // copy enqueued; free once copy_done and not hashing
    bool copy_done = false;      // the copy's event was seen complete
    LoadJob job{};
    uint64_t copy_enqueued_ns = 0;
    std::unique_ptr<device::Event> copied;
  };
  // A staged object whose xxh3 a hash worker checks while its copy runs.
  struct HashJob {
    uint32_t stage;      // its staging buffer
    LoadJob job;
    const uint8_t* staged;
    uint64_t expected;   // the pack's checksum, looked up on the I/O thread
    uint64_t bytes_read;
    uint64_t read_ns;
    uint64_t fallback;   // the engine's fallback count (its counters are I/O-thread only)
  };
  enum class ReapWait : uint8_t { kNone, kCopy, kOne };

  ExpertCache(ObjectSource src, device::Device& dev, const CacheOptions& opts);
  Status init();
  Status init_host_tier();

  // placement.cpp, all under mu_.
  bool is_protected(Key k, bool for_demand) const;
  // A certain hint's expert, not acquired yet, within its protection (prefetch()).
  bool held_hint(const Slot& s) const { return s.certain && s.hint_step + 1 >= step_; }
  void start_load(uint32_t slot, Key k, bool prefetch);
  void unpin(Key k);
  // Pins k for a request: its resident slot, else a new one (load started).
  // placed == false when every slot is protected. `request` (sorted): keys of
  // the same request, never evicted for it.
  Take take_key(Key k, Phase phase, TakeCounts& n, std::span<const Key> request = {});
  void count_takes(uint32_t layer, const TakeCounts& n);
  // Gives deferred keys slots, oldest ticket first; returns loads started.
  size_t place_deferred();
  // After pins were dropped: places deferred keys, unlocks, wakes whoever needs it.
  void after_unpin(std::unique_lock<std::mutex>& lk);

  // tickets.cpp, under mu_.
  // Entry `index` of a ticket that is not released yet, or why not (`op` names
  // the call in the message).
  Result<LiveEntry> live_entry(std::string_view op, TicketId ticket, size_t index);
  ExpertHandle handle_of(const Ticket& t, size_t index) const;

  // tiering.cpp, under mu_.
  // `slot` was just taken from its resident key (still slots_[slot].key): with
  // a tier and loaded bytes, copies them out to a frame.
  void demote(uint32_t slot);
  // Loads k into `slot`, whose resident key was just evicted if `evicted`
  // (demoted first): from the host tier when it holds k (the slot is then in
  // its copy stream at once, no read), else start_load.
  void fill_slot(uint32_t slot, Key k, bool evicted, bool prefetch);
  uint8_t* frame_data(uint32_t frame) const { return frames_base_ + uint64_t(frame) * frame_stride_; }

  // prefetch.cpp, under mu_.
  // Takes a queued, unstarted prefetch of `slot` off its queue (its slot is being
  // reused or the guess expired).
  void cancel_queued_prefetch(uint32_t slot);
  // Moves a queued prefetch of `slot` to the demand queue.
  void promote_queued_prefetch(uint32_t slot);
  // Drops queued prefetches older than one step; returns how many.
  uint64_t expire_prefetches();

  // io_loop.cpp.
  // Tells the I/O thread there is work: its condition variable (where it waits
  // with nothing in flight) and, if it sleeps in the kernel, the engine's
  // wake-up. Call without mu_ held, with the value io_sleeping_ had under mu_.
  void notify_io(bool sleeping);
  void io_loop();
  // Frees staging buffers whose copy completed and whose hash finished; returns
  // how many. kCopy: first waits for the oldest copy still running, if any (a
  // buffer frees within one H2D copy); kOne: waits until at least one is free
  // (every buffer is being delivered). I/O thread.
  size_t reap_staging(ReapWait how);
  bool hash_pending(uint32_t stage);

  // delivery.cpp.
  void on_read_complete(const io::Completion& c);  // I/O thread
  void fail_load(const LoadJob& job, int code);   // any thread; takes mu_
  // A load whose bytes are in the slot's copy stream (and verified): counts it and
  // makes the slot visible to waiters. Any thread; takes mu_.
  void publish(const LoadJob& job, uint64_t bytes_read, uint64_t read_ns, uint64_t fallback);
  void hash_loop();
  void check_hash(const HashJob& j);

  ObjectSource src_;
  device::Device& dev_;
  CacheOptions opts_;
  uint32_t n_slots_ = 0;
  uint64_t slot_stride_ = 0;
  uint8_t* slots_base_ = nullptr;
  // The host tier: bookkeeping under mu_; frames in one pinned mapping.
  std::unique_ptr<HostTier> host_;
  uint8_t* frames_base_ = nullptr;
  uint64_t frames_bytes_ = 0;
  uint64_t frame_stride_ = 0;

  mutable std::mutex mu_;
  std::condition_variable state_cv_;  // a slot left kLoading
  std::condition_variable io_cv_;     // new jobs or stop
  std::unique_ptr<SlotDirectory> dir_;
  std::vector<Slot> slots_;
  std::unordered_map<TicketId, Ticket> tickets_;
  std::set<TicketId> deferred_tickets_;  // tickets with deferred keys, oldest first
  TicketId next_ticket_ = 1;
  // Loads waiting for a staging buffer; the I/O thread takes demand loads first.
  // (The engine's own queue, of read ranges waiting for the ring, is its pending_.)
  std::deque<LoadJob> demand_loads_;
  std::deque<LoadJob> prefetch_loads_;
  uint64_t step_ = 0;
  int64_t last_layer_ = -1;
  bool stop_ = false;
  bool io_sleeping_ = false;          // the I/O thread is blocked in engine poll

  // I/O thread only.
  // Start of the current stretch with reads in flight (now_ns), 0 while none
  // is: written by the I/O thread, read by counters() to count an open stretch.
  std::atomic<uint64_t> busy_since_ns_{0};
  // Opens or closes the busy stretch after the engine's in-flight count changed.
  void track_busy();
  std::unique_ptr<io::DeviceHostRegistrar> registrar_;
  std::unique_ptr<io::ReadEngine> engine_;
  std::vector<StagingBuffer> staging_;  // index: the stage (the engine's slot)
  std::thread io_thread_;

  // Verification beside the copy: jobs from the I/O thread to the hash workers.
  std::mutex hash_mu_;
  std::condition_variable hash_cv_;       // a job was queued, or stop
  std::condition_variable hash_done_cv_;  // a buffer's hash finished (the I/O thread waits)
  std::deque<HashJob> hash_jobs_;
  std::vector<uint8_t> hashing_;          // per stage: its hash is queued or running
  bool hash_stop_ = false;
  std::vector<std::thread> hash_threads_;

  stats::Telemetry telemetry_;
  std::mutex stats_write_mu_;
  std::unique_ptr<stats::RoutingTraceWriter> trace_;
};

}  // namespace xpack::cache
