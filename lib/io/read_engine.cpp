#include "io/read_engine.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/checked_math.h"
#include "io/alignment.h"
#include "io/memlock.h"
#include "io/read_splits.h"

namespace xpack::io {

namespace {

constexpr uint32_t kMaxTransientRetries = 64;
constexpr unsigned kReapBatch = 64;
constexpr unsigned kMaxRegisteredBuffers = 16384;  // kernel IORING_MAX_REG_BUFFERS
// user_data of the wake-up poll; read ids are slot * max_splits + split < 2^32.
constexpr uint64_t kWakeTag = ~0ull;

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string status_text(int status) {
  if (status == XPACK_E_TRUNCATED) return "end of file before the end of the object";
  return fmt::format("{} (errno {})", strerror(-status), -status);
}

}  // namespace

ReadEngine::ReadEngine(EngineConfig cfg) : cfg_(std::move(cfg)) {}

Result<std::unique_ptr<ReadEngine>> ReadEngine::create(EngineConfig cfg) {
  if (cfg.slot_count == 0 || cfg.slot_count > 65536)
    return err(XPACK_E_INVALID_ARG, "slot count {} out of range 1..65536", cfg.slot_count);
  if (cfg.slot_bytes == 0) return err(XPACK_E_INVALID_ARG, "slot size is 0");
  if (cfg.queue_depth == 0 || cfg.queue_depth > 4096)
    return err(XPACK_E_INVALID_ARG, "queue depth {} out of range 1..4096", cfg.queue_depth);
  if (cfg.read_splits == 0 || cfg.read_splits > kMaxReadSplits)
    return err(XPACK_E_INVALID_ARG, "read_splits {} out of range 1..{}", cfg.read_splits,
               kMaxReadSplits);

  std::unique_ptr<ReadEngine> e(new ReadEngine(std::move(cfg)));
  const EngineConfig& c = e->cfg_;
  const FaultPlan* plan = c.faults ? c.faults : default_fault_plan();
  if (plan) e->faults_.emplace(*plan);

  XPACK_ASSIGN_OR_RETURN(e->files_, ReadFileSet::open(
                                        c.paths, c.direct_io,
                                        e->faults_ ? e->faults_->open_direct_errno() : 0));

  if (c.wakeable) {
    e->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->wake_fd_ < 0) return errno_error("eventfd for the engine's wake-up");
  }
  RingOptions ro;
  // One more entry so the wake-up poll never competes with reads for an SQE.
  ro.entries = c.queue_depth + (c.wakeable ? 1 : 0);
  ro.sqpoll = c.sqpoll;
  ro.inject_setup_errno = e->faults_ ? e->faults_->ring_setup_errno() : 0;
  XPACK_ASSIGN_OR_RETURN(e->ring_, Ring::create(ro));

  ArenaConfig ac;
  ac.slot_count = c.slot_count;
  ac.slot_bytes = c.slot_bytes;
  ac.numa_node = c.numa_node;
  ac.huge_pages = c.huge_pages;
  XPACK_ASSIGN_OR_RETURN(e->arena_, StagingArena::create(ac));
  if (c.registrar) XPACK_TRY(e->arena_->attach_registrar(c.registrar));

  if (c.fixed_buffers) {
    const auto& iov = e->arena_->iovecs();
    if (iov.size() > kMaxRegisteredBuffers)
      return err(XPACK_E_LIMIT, "{} registered buffers needed, the kernel allows {}", iov.size(),
                 kMaxRegisteredBuffers);
    // Whole huge pages are charged, so the mapped (2 MiB-rounded) size counts.
    XPACK_TRY(ensure_memlock(e->arena_->mapped_bytes()));
    int ret = io_uring_register_buffers(e->ring_->get(), iov.data(),
                                        static_cast<unsigned>(iov.size()));
    if (ret == -ENOMEM) {
      rlimit lim{};
      getrlimit(RLIMIT_MEMLOCK, &lim);
      return err(XPACK_E_LIMIT, "io_uring_register_buffers: out of locked memory: {}",
                 memlock_advice(e->arena_->mapped_bytes(), lim.rlim_cur, lim.rlim_max));
    }
    if (ret == -EOPNOTSUPP)
      return err(-EOPNOTSUPP,
                 "io_uring_register_buffers refused the staging memory (EOPNOTSUPP): it must be "
                 "anonymous memory, not a device mapping such as cudaHostAlloc");
    if (ret < 0)
      return err(ret, "io_uring_register_buffers ({} buffers, {} bytes): {}", iov.size(),
                 e->arena_->total_bytes(), strerror(-ret));
    e->buffers_registered_ = true;
  }
  if (c.fixed_files) {
    auto fds = e->files_->fds();
    int ret = io_uring_register_files(e->ring_->get(), fds.data(), static_cast<unsigned>(fds.size()));
    if (ret < 0) return err(ret, "io_uring_register_files: {}", strerror(-ret));
    e->files_registered_ = true;
  }

  e->max_splits_ = c.read_splits + static_cast<uint32_t>(e->arena_->pieces_per_slot());
  e->slots_.resize(c.slot_count);
  e->splits_.resize(static_cast<size_t>(c.slot_count) * e->max_splits_);
  return e;
}

ReadEngine::~ReadEngine() {
  // Let in-flight reads land before the arena goes away. Only the issuer may wait
  // on a SINGLE_ISSUER/DEFER_TASKRUN ring; from any other thread we rely on the
  // kernel keeping the pages pinned until the reads end.
  if (ring_ && in_flight_ > 0 && issuer_ && *issuer_ == std::this_thread::get_id()) {
    pending_.clear();
    while (in_flight_ > 0) {
      if (unsubmitted_ > 0) io_uring_submit(ring_->get());
      io_uring_cqe* cqe = nullptr;
      int ret = io_uring_wait_cqe(ring_->get(), &cqe);
      if (ret == -EINTR) continue;
      if (ret < 0) break;
      bool wake = io_uring_cqe_get_data64(cqe) == kWakeTag;
      io_uring_cqe_seen(ring_->get(), cqe);
      if (!wake) --in_flight_;
    }
  }
  // The ring holds its own reference to the eventfd while the poll is armed.
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ReadEngine::wake() {
  if (wake_fd_ < 0) return;
  uint64_t one = 1;
  // EAGAIN only if the counter is about to overflow: a wake-up is pending anyway.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void ReadEngine::arm_wakeup() {
  if (wake_fd_ < 0 || wake_armed_) return;
  io_uring_sqe* sqe = io_uring_get_sqe(ring_->get());
  if (!sqe) return;  // the SQ is full of reads: armed on the next pump
  io_uring_prep_poll_add(sqe, wake_fd_, POLLIN);
  io_uring_sqe_set_data64(sqe, kWakeTag);
  wake_armed_ = true;
  ++unsubmitted_;
}

Status ReadEngine::check_issuer() {
  auto self = std::this_thread::get_id();
  if (!issuer_) {
    XPACK_TRY(ring_->enable());
    issuer_ = self;
    return {};
  }
  if (*issuer_ != self)
    return err(XPACK_E_INVALID_ARG,
               "the engine is single-issuer: submit and poll must come from the thread that "
               "first used it");
  return {};
}

Status ReadEngine::validate(const ReadRequest& r) const {
  if (r.file >= files_->size())
    return err(XPACK_E_INVALID_ARG, "file index {} out of range ({} files)", r.file, files_->size());
  if (r.slot >= slots_.size())
    return err(XPACK_E_INVALID_ARG, "slot {} out of range ({} slots)", r.slot, slots_.size());
  if (slots_[r.slot].state == SlotState::kReading)
    return err(XPACK_E_INVALID_ARG, "slot {} is still being read", r.slot);
  if (r.length == 0) return err(XPACK_E_INVALID_ARG, "read of 0 bytes into slot {}", r.slot);
  if (r.length > arena_->slot_bytes())
    return err(XPACK_E_INVALID_ARG, "read of {} bytes does not fit slot size {}", r.length,
               arena_->slot_bytes());
  if (!io_aligned(r.offset) || !io_aligned(r.length) || !io_aligned(arena_->slot(r.slot)))
    return err(XPACK_E_MISALIGNED,
               "read at offset {} of {} bytes into slot {}: offset, length and buffer must be "
               "multiples of {}",
               r.offset, r.length, r.slot, kDirectIoAlign);
  auto end = checked_add(r.offset, r.length);
  const auto& f = files_->at(r.file);
  if (!end || (f.size != 0 && *end > f.size))
    return err(XPACK_E_INVALID_ARG, "read [{}, +{}) lies beyond the end of {} ({} bytes)",
               r.offset, r.length, f.path, f.size);
  return {};
}

Status ReadEngine::submit(std::span<const ReadRequest> reqs) {
  XPACK_TRY(check_issuer());
  std::vector<bool> seen(slots_.size(), false);
  for (const auto& r : reqs) {
    XPACK_TRY(validate(r));
    if (seen[r.slot]) return err(XPACK_E_INVALID_ARG, "slot {} appears twice in one batch", r.slot);
    seen[r.slot] = true;
  }
  for (const auto& r : reqs) {
    SlotOp& s = slots_[r.slot];
    auto ranges = split_read(r.length, cfg_.read_splits, kMaxRegisteredBuffer);
    s.state = SlotState::kReading;
    s.req = r;
    s.n_splits = static_cast<uint32_t>(ranges.size());
    s.splits_left = s.n_splits;
    s.status = 0;
    s.submit_ns = 0;
    for (uint32_t i = 0; i < s.n_splits; ++i) {
      uint32_t id = r.slot * max_splits_ + i;
      SplitOp& op = splits_[id];
      op.file_offset = r.offset + ranges[i].offset;
      op.length = ranges[i].length;
      op.done = 0;
      op.buf = arena_->slot(r.slot) + ranges[i].offset;
      op.retries = 0;
      op.buf_index = buffers_registered_ ? arena_->buffer_index(op.buf, op.length) : -1;
      pending_.push_back(id);
    }
    ++objects_in_flight_;
    ++counters_.objects_submitted;
  }
  return pump();
}

Status ReadEngine::pump() {
  io_uring* ring = ring_->get();
  arm_wakeup();
  while (!pending_.empty() && in_flight_ < cfg_.queue_depth) {
    uint32_t id = pending_.front();
    uint32_t slot = id / max_splits_;
    if (slots_[slot].status != 0) {  // the object already failed: do not read more of it
      pending_.pop_front();
      finish_split(slot, 0);
      continue;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (!sqe) break;
    pending_.pop_front();
    SplitOp& op = splits_[id];
    const ReadRequest& r = slots_[slot].req;
    int fd = files_registered_ ? static_cast<int>(r.file) : files_->at(r.file).fd;
    uint8_t* buf = op.buf + op.done;
    auto len = static_cast<unsigned>(op.length - op.done);
    uint64_t off = op.file_offset + op.done;
    if (buffers_registered_)
      io_uring_prep_read_fixed(sqe, fd, buf, len, off, op.buf_index);
    else
      io_uring_prep_read(sqe, fd, buf, len, off);
    if (files_registered_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, id);
    if (slots_[slot].submit_ns == 0) slots_[slot].submit_ns = now_ns();
    ++in_flight_;
    ++unsubmitted_;
  }
  if (unsubmitted_ == 0) return {};
  for (;;) {
    int ret = io_uring_submit(ring);
    if (ret == -EINTR) continue;
    if (ret == -EAGAIN || ret == -EBUSY) break;  // kernel short of resources: retry on next poll
    if (ret < 0) return err(ret, "io_uring_submit: {}", strerror(-ret));
    ++counters_.submit_calls;
    break;
  }
  // With SQPOLL the kernel thread consumes the SQ on its own (waking it is
  // io_uring_submit's job); spinning until it did would burn a core. Without it,
  // whatever the kernel did not accept stays queued for the next pump.
  unsubmitted_ = cfg_.sqpoll ? 0 : io_uring_sq_ready(ring);
  return {};
}

void ReadEngine::handle_cqe(uint64_t user_data, int res) {
  if (user_data == kWakeTag) {
    wake_armed_ = false;
    woken_ = true;
    uint64_t count = 0;
    // Drain the counter so the re-armed poll waits for the next wake().
    [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof count);
    return;
  }
  --in_flight_;
  auto id = static_cast<uint32_t>(user_data);
  uint32_t slot = id / max_splits_;
  uint32_t split = id % max_splits_;
  SlotOp& s = slots_[slot];
  SplitOp& op = splits_[id];
  if (faults_) res = faults_->apply(s.req.tag, split, res);

  if (res < 0) {
    if ((res == -EINTR || res == -EAGAIN) && s.status == 0 &&
        op.retries < kMaxTransientRetries) {
      ++op.retries;
      ++counters_.transient_retries;
      // Behind the queued reads: the kernel was short of something, and other
      // objects should not wait for this one.
      pending_.push_back(id);
      return;
    }
    finish_split(slot, res);
    return;
  }
  if (res == 0) {  // EOF: the file is shorter than the object (truncated under us)
    finish_split(slot, XPACK_E_TRUNCATED);
    return;
  }
  ++counters_.reads;
  counters_.read_bytes += static_cast<uint64_t>(res);
  if (!cfg_.direct_io) ++counters_.fallback_count;
  op.done += static_cast<uint64_t>(res);
  if (op.done >= op.length) {
    finish_split(slot, 0);
    return;
  }
  // Short read. With O_DIRECT an unaligned stop can only be the end of the file
  // (the remainder could not even be requested), so that is a truncation.
  if (s.status != 0) {
    finish_split(slot, 0);
  } else if (cfg_.direct_io && !io_aligned(op.done)) {
    finish_split(slot, XPACK_E_TRUNCATED);
  } else {
    ++counters_.short_read_retries;
    pending_.push_front(id);
  }
}

void ReadEngine::finish_split(uint32_t slot, int status) {
  SlotOp& s = slots_[slot];
  if (status != 0 && s.status == 0) {
    s.status = status;
    const auto& f = files_->at(s.req.file);
    last_failure_ = fmt::format("read of {} bytes at offset {} of {} into slot {} failed: {}",
                                s.req.length, s.req.offset, f.path, slot, status_text(status));
  }
  if (--s.splits_left > 0) return;
  --objects_in_flight_;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < s.n_splits; ++i) bytes += splits_[slot * max_splits_ + i].done;
  if (s.submit_ns != 0) counters_.latency.record(now_ns() - s.submit_ns);
  if (s.status == 0) {
    s.state = SlotState::kReady;
    ++counters_.objects_completed;
  } else {
    s.state = SlotState::kFailed;
    ++counters_.io_errors;
  }
  deliver(Completion{slot, s.req.tag, s.status, bytes});
}

void ReadEngine::deliver(const Completion& c) {
  ++delivered_;
  if (cfg_.on_complete)
    cfg_.on_complete(c);
  else
    ready_.push_back(c);
}

size_t ReadEngine::drain_ready(std::vector<Completion>* out, size_t max) {
  size_t n = 0;
  while (!ready_.empty() && n < max && out) {
    out->push_back(ready_.front());
    ready_.pop_front();
    ++n;
  }
  return n;
}

size_t ReadEngine::reap_available() {
  io_uring* ring = ring_->get();
  size_t total = 0;
  bool entered = false;
  // DEFER_TASKRUN posts completions only when we ask the kernel for events.
  if ((in_flight_ > 0 || wake_armed_) && ring_->defer_taskrun()) {
    io_uring_get_events(ring);
    entered = true;
  }
  for (;;) {
    io_uring_cqe* cqes[kReapBatch];
    unsigned n = io_uring_peek_batch_cqe(ring, cqes, kReapBatch);
    if (n == 0) {
      if (!entered && (in_flight_ > 0 || wake_armed_) && total == 0) {
        io_uring_get_events(ring);  // run pending task work (COOP_TASKRUN) once
        entered = true;
        continue;
      }
      break;
    }
    // Copy out before handling: handlers may submit, and the CQ slots are
    // returned to the kernel right away.
    uint64_t data[kReapBatch];
    int res[kReapBatch];
    for (unsigned i = 0; i < n; ++i) {
      data[i] = io_uring_cqe_get_data64(cqes[i]);
      res[i] = cqes[i]->res;
    }
    io_uring_cq_advance(ring, n);
    for (unsigned i = 0; i < n; ++i) handle_cqe(data[i], res[i]);
    total += n;
  }
  return total;
}

Result<size_t> ReadEngine::poll(int timeout_ms, std::vector<Completion>* out, size_t max) {
  XPACK_TRY(check_issuer());
  const uint64_t delivered_at_start = delivered_;
  woken_ = false;
  size_t appended = 0;
  // Objects handed to the caller by this call: through the callback, or into *out.
  auto handed_out = [&]() -> uint64_t {
    return cfg_.on_complete ? delivered_ - delivered_at_start : appended;
  };
  appended = drain_ready(out, max);
  if (appended == 0) {
    reap_available();
    XPACK_TRY(pump());
    appended += drain_ready(out, max - appended);
  }
  const uint64_t deadline = timeout_ms > 0 ? now_ns() + uint64_t(timeout_ms) * 1000000ull : 0;
  while (timeout_ms != 0 && handed_out() == 0 && objects_in_flight_ > 0 && !woken_) {
    // unsubmitted_ may include the wake-up poll: <= then errs towards retrying.
    if (in_flight_ <= unsubmitted_) {
      // Nothing is in the kernel (everything is queued behind a refused submit,
      // EAGAIN): waiting for a CQE would never return. Retry, back off briefly.
      XPACK_TRY(pump());
      if (in_flight_ <= unsubmitted_) {
        timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
      }
    } else {
      io_uring_cqe* cqe = nullptr;
      int ret;
      if (timeout_ms < 0) {
        ret = io_uring_wait_cqe(ring_->get(), &cqe);
      } else {
        uint64_t now = now_ns();
        if (now >= deadline) break;
        uint64_t left = deadline - now;
        __kernel_timespec ts{static_cast<long long>(left / 1000000000ull),
                             static_cast<long long>(left % 1000000000ull)};
        ret = io_uring_wait_cqe_timeout(ring_->get(), &cqe, &ts);
      }
      if (ret < 0 && ret != -ETIME && ret != -EINTR)
        return err(ret, "waiting for io_uring completions: {}", strerror(-ret));
      reap_available();
      XPACK_TRY(pump());
      appended += drain_ready(out, max - appended);
    }
    if (timeout_ms > 0 && now_ns() >= deadline) break;
  }
  return cfg_.on_complete ? static_cast<size_t>(handed_out()) : appended;
}

}  // namespace xpack::io
