// From a finished read to a published slot: the length check, the H2D copy,
// the checksum beside it (hash workers), and failure.
#include "cache/expert_cache.h"

#include "cache/cache_clock.h"
#include "io/read_engine.h"
#include "pack/format.h"

namespace xpack::cache {

void ExpertCache::on_read_complete(const io::Completion& c) {
  const uint32_t stage = c.slot;  // the engine calls its staging buffers slots
  StagingBuffer& st = staging_[stage];
  LoadJob job = st.job;
  uint64_t read_ns = now_ns() - job.queued_ns;
  int status = c.status;
  const uint8_t* staged = engine_->slot_data(stage);
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
    hashing_[stage] = 1;
    hash_jobs_.push_back(HashJob{stage, job, staged, src_.checksum(key_layer(job.key), key_expert(job.key)),
                                 c.bytes, read_ns, fallback});
  }
  hash_cv_.notify_one();
}

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
    s.certain = false;
    if (s.pins == 0) {  // nobody waits: drop it now
      dir_->remove(job.key);
      s.state = SlotState::kEmpty;
      if (!deferred_tickets_.empty()) place_deferred();  // loads queue for this thread
    }
  }
  state_cv_.notify_all();
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

void ExpertCache::check_hash(const HashJob& j) {
  int status = 0;
  if (pack::xxh3(j.staged, src_.object_bytes) != j.expected) {
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
    hashing_[j.stage] = 0;
    hash_done_cv_.notify_all();
    hl.unlock();
    // A freed buffer, or loads placed for deferred keys by publish/fail_load: the
    // I/O thread may be asleep in the kernel or on its condition variable.
    notify_io(true);
    hl.lock();
  }
}

}  // namespace xpack::cache
