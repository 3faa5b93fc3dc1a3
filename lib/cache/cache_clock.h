// The one clock of the cache's latency counters and prefetch ages.
#pragma once

#include <chrono>
#include <cstdint>

namespace xpack::cache {

inline uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

}  // namespace xpack::cache
