// Replays a routing trace against one cache of N slots shared by all layers,
// with the runtime's rules: the experts of one (step, layer) group are requested
// together (hits and misses counted once per distinct key), stay protected until
// the group ends, and a group of more than top_k lines is a prefill request.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/policy.h"
#include "stats/routing_trace.h"

namespace xpack::cache {

struct ReplayOptions {
  uint64_t capacity = 0;  // slots
  PolicyKind policy = PolicyKind::kAdaptive;
  // Lines per token; 0 = the smallest group size in the trace (a decode step).
  uint32_t top_k = 0;
  // Host tier frames behind the slots (0 = none), with the runtime's rules
  // (host_tier.h): device evictions demote, a miss the tier holds is a host hit.
  uint64_t host_capacity = 0;
  // A prefill evicts keys no decode step used first (slot_directory.h), as the
  // runtime cache does; false replays without that rule.
  bool protect_decode = true;
};

struct LayerCounts {
  uint64_t hits = 0;
  uint64_t misses = 0;
};

struct ReplayResult {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  // Misses that found every slot protected (a group wider than the cache): the
  // expert is streamed without being kept, as a runtime wave would.
  uint64_t bypassed = 0;
  uint64_t host_hits = 0;       // misses the host tier served (no SSD read)
  uint64_t host_demotions = 0;
  uint64_t host_evictions = 0;
  std::vector<LayerCounts> per_layer;  // index = layer
  double hit_rate() const {
    return hits + misses ? double(hits) / double(hits + misses) : 0.0;
  }
  // Lookups either tier served: what the SSD was spared.
  double hit_rate_with_host() const {
    return hits + misses ? double(hits + host_hits) / double(hits + misses) : 0.0;
  }
};

Result<ReplayResult> replay_trace(const std::vector<stats::TraceRecord>& trace,
                                  const ReplayOptions& opts);

}  // namespace xpack::cache
