// The read engine: object reads from registered files into staging slots over one
// io_uring, completion-driven. Generic over (file index, offset, length, slot);
// pack_reads.h binds it to Expert Pack objects.
//
// Flow: submit() validates a batch (all or nothing), cuts every object into its
// read_splits ranges and queues them; pump() turns queued ranges into SQEs up to
// the queue depth and calls io_uring_submit once. poll() reaps CQEs in batches,
// retries short reads for the remainder and EINTR/EAGAIN as they are, and when
// the last range of an object is done delivers that object (in completion order)
// to the callback or the completion queue, then refills the ring.
//
// Thread-safety: single issuer. The first thread that submits or polls becomes
// the issuer (the ring is SINGLE_ISSUER); calls from another thread fail with
// XPACK_E_INVALID_ARG. wake() is the exception: any thread may call it at any
// time. Destruction may happen on any thread once no call runs.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "io/engine_defaults.h"
#include "io/fault_injection.h"
#include "io/io_counters.h"
#include "io/read_file_set.h"
#include "io/staging_arena.h"
#include "io/uring_ring.h"

namespace xpack::io {

struct ReadRequest {
  uint32_t file = 0;     // index into EngineConfig::paths
  uint64_t offset = 0;   // file offset, 4096-aligned
  uint64_t length = 0;   // bytes to read, 4096-aligned, <= slot size
  uint32_t slot = 0;     // staging slot
  uint64_t tag = 0;      // caller's identifier, returned in the completion
};

struct Completion {
  uint32_t slot = 0;
  uint64_t tag = 0;
  int status = 0;        // 0, -errno, or XPACK_E_TRUNCATED (EOF before the end)
  uint64_t bytes = 0;    // bytes read (== length on success)
};

enum class SlotState : uint8_t { kEmpty, kReading, kReady, kFailed };

struct EngineConfig {
  std::vector<std::string> paths;
  uint32_t slot_count = kDefaultStagingBuffers;
  uint64_t slot_bytes = 0;
  uint32_t queue_depth = kDefaultQueueDepth;  // SQEs in flight at most (ring size)
  uint32_t read_splits = kDefaultReadSplits;  // 1..kMaxReadSplits
  bool sqpoll = false;
  bool direct_io = true;       // false: buffered reads, each counted in fallback_count
  bool fixed_buffers = true;   // register the arena (read_fixed)
  bool fixed_files = true;     // register the files (IOSQE_FIXED_FILE)
  int numa_node = -1;
  bool huge_pages = true;       // false: 4 KiB staging pages (diagnostics, see ArenaConfig)
  HostMemoryRegistrar* registrar = nullptr;  // device pinning of the arena, optional
  const FaultPlan* faults = nullptr;         // tests; falls back to default_fault_plan()
  // An eventfd polled through the ring, so that wake() from another thread ends
  // a blocking poll() at once (a producer handing the issuer new work).
  bool wakeable = false;
  // Called for each finished object instead of queueing it for poll(); runs on
  // the issuing thread inside poll()/submit(); may call submit().
  std::function<void(const Completion&)> on_complete;
};

class ReadEngine {
 public:
  static Result<std::unique_ptr<ReadEngine>> create(EngineConfig cfg);
  ~ReadEngine();
  ReadEngine(const ReadEngine&) = delete;
  ReadEngine& operator=(const ReadEngine&) = delete;

  // Queues the reads and submits as many as the depth allows with one
  // io_uring_submit. Validation is all-or-nothing: a bad request (misaligned,
  // slot busy, out of range) rejects the whole batch.
  Status submit(std::span<const ReadRequest> reqs);

  // Reaps completions. timeout_ms: 0 = do not block, < 0 = block until at least
  // one object finished (or nothing is in flight), > 0 = block at most that long.
  // Appends at most `max` finished objects to *out (ignored with on_complete)
  // and returns how many were appended.
  // With `wakeable`, a wake() also ends the wait (returning 0 if nothing finished).
  Result<size_t> poll(int timeout_ms, std::vector<Completion>* out, size_t max = SIZE_MAX);

  // Ends the issuer's current or next blocking poll(). Thread-safe, async-signal-
  // safe (one eventfd write); a no-op unless the engine was created wakeable.
  void wake();
  // Whether the last poll() returned because of wake().
  bool woken() const { return woken_; }

  SlotState slot_state(uint32_t slot) const { return slots_[slot].state; }
  // Slot memory; meaningful only when slot_state == kReady.
  uint8_t* slot_data(uint32_t slot) const { return arena_->slot(slot); }
  uint32_t slot_count() const { return arena_->slot_count(); }
  uint64_t slot_bytes() const { return arena_->slot_bytes(); }
  StagingArena& arena() { return *arena_; }
  const StagingArena& arena() const { return *arena_; }
  const ReadFileSet& files() const { return *files_; }
  uint64_t objects_in_flight() const { return objects_in_flight_; }
  const IoCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = IoCounters(); }
  unsigned ring_flags() const { return ring_->flags(); }
  std::string ring_description() const { return ring_->describe(); }
  const EngineConfig& config() const { return cfg_; }
  // Why the most recent failed object failed ("" if none yet).
  const std::string& last_failure() const { return last_failure_; }

 private:
  struct SplitOp {
    uint64_t file_offset = 0;
    uint64_t length = 0;
    uint64_t done = 0;
    uint8_t* buf = nullptr;
    uint32_t retries = 0;
    int buf_index = -1;
  };
  struct SlotOp {
    SlotState state = SlotState::kEmpty;
    ReadRequest req;
    uint32_t n_splits = 0;
    uint32_t splits_left = 0;  // not yet finished (queued or in flight)
    int status = 0;
    uint64_t submit_ns = 0;    // when the first range entered the kernel
  };

  explicit ReadEngine(EngineConfig cfg);
  Status check_issuer();
  Status validate(const ReadRequest& r) const;
  Status pump();
  void handle_cqe(uint64_t user_data, int res);
  void finish_split(uint32_t slot, int status);
  void deliver(const Completion& c);
  size_t drain_ready(std::vector<Completion>* out, size_t max);
  size_t reap_available();
  void arm_wakeup();

  EngineConfig cfg_;
  std::optional<FaultState> faults_;
  std::unique_ptr<StagingArena> arena_;
  std::unique_ptr<ReadFileSet> files_;
  std::unique_ptr<Ring> ring_;
  bool buffers_registered_ = false;
  bool files_registered_ = false;
  uint32_t max_splits_ = 1;
  std::vector<SlotOp> slots_;
  std::vector<SplitOp> splits_;           // slot * max_splits_ + split
  std::deque<uint32_t> pending_;          // split op ids waiting for an SQE
  uint32_t in_flight_ = 0;                // SQEs handed to the kernel
  uint32_t unsubmitted_ = 0;              // SQEs prepared but not yet accepted
  uint64_t objects_in_flight_ = 0;
  std::deque<Completion> ready_;
  std::optional<std::thread::id> issuer_;
  std::string last_failure_;
  uint64_t delivered_ = 0;                // objects handed out (callback or queue)
  int wake_fd_ = -1;                      // eventfd, with `wakeable`
  bool wake_armed_ = false;               // its poll request is in the ring
  bool woken_ = false;
  IoCounters counters_;
};

}  // namespace xpack::io
