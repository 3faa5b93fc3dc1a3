// The I/O thread: hands queued loads staging buffers, submits and polls the read
// engine, and recycles staging buffers once their copy (and hash) finished.
#include "cache/expert_cache.h"

#include <algorithm>

#include "cache/cache_clock.h"
#include "io/read_engine.h"

namespace xpack::cache {

void ExpertCache::notify_io(bool sleeping) {
  io_cv_.notify_one();
  if (sleeping) engine_->wake();
}

void ExpertCache::track_busy() {
  const bool in_flight = engine_->objects_in_flight() > 0;
  const uint64_t since = busy_since_ns_.load(std::memory_order_relaxed);
  if (in_flight && since == 0) {
    busy_since_ns_.store(now_ns(), std::memory_order_relaxed);
  } else if (!in_flight && since != 0) {
    // Counted and closed in one update, so a snapshot never counts it twice.
    telemetry_.update([&](stats::Counters& c) {
      c.ssd_busy_ns += now_ns() - since;
      busy_since_ns_.store(0, std::memory_order_relaxed);
    });
  }
}

stats::Counters ExpertCache::counters() const {
  return telemetry_.snapshot([&](stats::Counters& c) {
    const uint64_t since = busy_since_ns_.load(std::memory_order_relaxed);
    if (since) c.ssd_busy_ns += now_ns() - since;
  });
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
        return stop_ || !demand_loads_.empty() || !prefetch_loads_.empty() ||
               engine_->objects_in_flight() > 0;
      };
      if (!has_work()) io_cv_.wait(lk, has_work);
      if (stop_ && demand_loads_.empty() && prefetch_loads_.empty() &&
          engine_->objects_in_flight() == 0)
        break;
      expired = expire_prefetches();
      if (expired && !deferred_tickets_.empty() && place_deferred() > 0) state_cv_.notify_all();
      // Demand loads first; prefetches only use staging left over.
      uint32_t stage = 0;
      auto take = [&](std::deque<LoadJob>& q) {
        while (!q.empty() && free_staging > 0) {
          while (staging_[stage].busy) ++stage;
          StagingBuffer& st = staging_[stage];
          st.busy = true;
          st.job = q.front();
          q.pop_front();
          slots_[st.job.slot].queued = false;
          --free_staging;
          batch.push_back(io::ReadRequest{0, src_.offset(key_layer(st.job.key),
                                                         key_expert(st.job.key)),
                                          src_.read_bytes, stage, st.job.key});
        }
      };
      take(demand_loads_);
      take(prefetch_loads_);
      want_more = !demand_loads_.empty() || !prefetch_loads_.empty();
    }
    if (expired) telemetry_.update([&](stats::Counters& c) { c.prefetch_wasted += expired; });
    if (!batch.empty()) {
      Status st = engine_->submit(batch);
      if (!st.ok()) {
        for (auto& r : batch) {  // r.slot: the engine's name for the stage
          staging_[r.slot].busy = false;
          fail_load(staging_[r.slot].job, st.error().code);
        }
      }
      track_busy();
    }
    if (engine_->objects_in_flight() > 0) {
      auto got = engine_->poll(0, &unused);
      track_busy();
      if (!got.ok() || *got > 0) continue;
      bool copying = std::any_of(staging_.begin(), staging_.end(),
                                 [](const StagingBuffer& st) { return st.delivering && !st.copy_done; });
      std::unique_lock lk(mu_);
      bool queued = !demand_loads_.empty() || !prefetch_loads_.empty();
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
      track_busy();
      lk.lock();
      io_sleeping_ = false;
    } else if (want_more) {
      reap_staging(ReapWait::kOne);  // every staging buffer is being delivered
    }
  }
}

size_t ExpertCache::reap_staging(ReapWait how) {
  size_t freed = 0;
  auto copy_seen_done = [&](StagingBuffer& st) {
    telemetry_.update([&](stats::Counters& c) { c.h2d_latency.record(now_ns() - st.copy_enqueued_ns); });
    st.copy_done = true;
  };
  for (;;) {
    StagingBuffer* oldest_copy = nullptr;
    bool hashes = false;
    for (uint32_t i = 0; i < staging_.size(); ++i) {
      StagingBuffer& st = staging_[i];
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

bool ExpertCache::hash_pending(uint32_t stage) {
  std::lock_guard hl(hash_mu_);
  return hashing_[stage] != 0;
}

}  // namespace xpack::cache
