// The expert cache's options. The I/O knobs' defaults and limits have their one
// home in io/engine_defaults.h; the C API's xpack_cache_options mirrors these fields.
#pragma once

#include <cstdint>
#include <string>

#include "cache/policy.h"
#include "io/engine_defaults.h"
#include "io/fault_injection.h"

namespace xpack::cache {

struct CacheOptions {
  uint64_t budget_bytes = 0;   // requested device bytes; 0 = as much as is free
  uint64_t reserve_bytes = 0;  // device bytes left free for everything else
  // Pinned host memory for the host tier (host_tier.h); 0 = no tier. Whole frames
  // only, at most one per object beyond the device slots.
  uint64_t host_cache_bytes = 0;
  PolicyKind policy = PolicyKind::kAdaptive;  // belady is refused (offline only)
  // Staging buffers, one object each (the public name, as in xpack_cache_options
  // and the stats JSON): 1..4096.
  uint32_t staging_slots = io::kDefaultStagingBuffers;
  uint32_t read_splits = io::kDefaultReadSplits;  // 1..io::kMaxReadSplits
  uint32_t queue_depth = io::kDefaultQueueDepth;
  bool direct_io = true;
  bool verify = false;         // xxh3 of every object on arrival
  std::string stats_path;      // JSON written atomically; empty = none
  uint64_t stats_interval = 0; // write every N releases (and at close); 0 = close only
  std::string trace_path;      // routing trace CSV; empty = none
  const io::FaultPlan* faults = nullptr;  // tests
};

}  // namespace xpack::cache
