// What the engine counts. Plain integers: the engine is single-issuer, so only
// the issuing thread writes them; readers on other threads must synchronise.
#pragma once
#include <cstdint>

#include "common/latency_histogram.h"

namespace xpack::io {

struct IoCounters {
  uint64_t reads = 0;               // read operations completed with data (splits, retries)
  uint64_t read_bytes = 0;          // bytes those operations delivered
  uint64_t objects_submitted = 0;
  uint64_t objects_completed = 0;   // objects whose every byte arrived
  uint64_t io_errors = 0;           // objects that failed (their slot is not ready)
  uint64_t fallback_count = 0;      // reads that went through the page cache (direct_io off)
  uint64_t short_read_retries = 0;  // resubmissions of the remainder after a short read
  uint64_t transient_retries = 0;   // resubmissions after EINTR / EAGAIN
  uint64_t submit_calls = 0;        // io_uring_submit calls that submitted something
  LatencyHistogram latency;         // per object: first submit -> last split done
};

}  // namespace xpack::io
