// The expert cache's telemetry. Every event updates the counters under one lock,
// so a snapshot is always consistent (e.g. hits + misses equals the distinct
// experts requested so far, and pack_read_bytes equals completed reads x object
// size). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "common/latency_histogram.h"

namespace xpack::stats {

struct Counters {
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t cache_evictions = 0;
  uint64_t pack_reads = 0;        // objects read from the pack
  uint64_t pack_read_bytes = 0;
  uint64_t h2d_bytes = 0;
  uint64_t fallback_count = 0;    // reads that went through the page cache
  uint64_t io_errors = 0;         // objects that failed to arrive intact
  uint64_t prefetch_issued = 0;   // prefetch loads started
  uint64_t prefetch_used = 0;     // prefetched experts later requested
  uint64_t prefetch_wasted = 0;   // prefetched experts evicted (or failed) unused
  uint64_t acquires = 0;          // acquire calls
  uint64_t steps = 0;             // release calls (one per layer-step)
  uint64_t stall_ns = 0;          // time callers spent blocked waiting for misses
  uint64_t stall_waits = 0;       // waits that had to block
  uint64_t trace_write_errors = 0;  // routing trace writes or flushes that failed
  // The host tier: device misses it served (no SSD read; a subset of
  // cache_misses), device evictions it took in, keys it dropped for room, and
  // the bytes of the demotions (device->host).
  uint64_t host_hits = 0;
  uint64_t host_demotions = 0;
  uint64_t host_evictions = 0;
  uint64_t d2h_bytes = 0;
  // Time at least one object read was in flight: how busy the cache kept the SSD
  // (over a decode's wall time, the busy fraction), measured, not inferred from bytes.
  uint64_t ssd_busy_ns = 0;
  // How the I/O staging memory is backed (set once at creation): the page size of
  // most of it (2 MiB or 4 KiB; 0 = unknown) and the fraction in huge pages.
  uint64_t staging_page_bytes = 0;
  double staging_huge_fraction = 0;
  std::vector<uint64_t> route_calls_by_layer;
  std::vector<uint64_t> route_tokens_by_layer;
  std::vector<uint64_t> hits_by_layer;
  std::vector<uint64_t> misses_by_layer;
  LatencyHistogram read_latency;    // submit -> object in staging
  LatencyHistogram h2d_latency;    // copy enqueued -> copy done
};

class Telemetry {
 public:
  explicit Telemetry(uint32_t n_layers) {
    c_.route_calls_by_layer.assign(n_layers, 0);
    c_.route_tokens_by_layer.assign(n_layers, 0);
    c_.hits_by_layer.assign(n_layers, 0);
    c_.misses_by_layer.assign(n_layers, 0);
  }
  // Applies one event's changes atomically with respect to snapshot().
  void update(const std::function<void(Counters&)>& fn) {
    std::lock_guard lk(mu_);
    fn(c_);
  }
  // A snapshot with `adjust` applied under the same lock: for state kept outside
  // the counters (an open interval) whose closing is itself an update.
  Counters snapshot(const std::function<void(Counters&)>& adjust) const {
    std::lock_guard lk(mu_);
    Counters c = c_;
    adjust(c);
    return c;
  }
  Counters snapshot() const {
    std::lock_guard lk(mu_);
    return c_;
  }

 private:
  mutable std::mutex mu_;
  Counters c_;
};

}  // namespace xpack::stats
