// The I/O knobs' defaults and the read-splits limit, one home each. The engine's
// config, the cache's options and the C API's option structs take them from here;
// the values that include/xpack/xpack.h's comments state are checked against them
// (test/cache/test_cache_limits.cpp).
#pragma once
#include <cstdint>

namespace xpack::io {

// Staging buffers, one object each (the engine's slots, the cache's staging_slots):
// the seed's DeepSeek loader default (stage_slots = 8).
inline constexpr uint32_t kDefaultStagingBuffers = 8;
// Reads in flight at most (the ring size).
inline constexpr uint32_t kDefaultQueueDepth = 64;
// Aligned ranges per object read: the seed's loaders read an object whole.
inline constexpr uint32_t kDefaultReadSplits = 1;
// The most ranges one object read may be cut into, for the engine and the cache
// alike. A bound against absurd values, not a tuning limit: a 13.4 MB expert cut
// 256 ways is still 52 KB per range, and the engine keeps a split table of
// staging buffers x (splits + arena pieces) entries.
inline constexpr uint32_t kMaxReadSplits = 256;

}  // namespace xpack::io
