// Option checks and slot sizing of the expert cache: pure functions of the object
// source, the options and the device's free memory, so every refusal of a
// configuration and the budget's arithmetic live in one place (and can be tested
// without a device).
#pragma once

#include <cstdint>

#include "cache/cache_options.h"
#include "cache/object_source.h"
#include "common/result.h"
#include "device/device.h"

namespace xpack::cache {

// Device slots start at this alignment so kernels can use vector loads.
inline constexpr uint64_t kSlotAlignment = 256;
// The most staging buffers a cache takes (each holds one whole object).
inline constexpr uint32_t kMaxStagingBuffers = 4096;

// XPACK_E_INVALID_ARG / XPACK_E_MISALIGNED for a source or options the cache
// cannot run with.
Status check_options(const ObjectSource& src, const CacheOptions& opts);

struct SlotSizing {
  uint32_t count = 0;   // device slots
  uint64_t stride = 0;  // bytes from one slot's start to the next
};
// count = floor(min(requested, free - reserve) / stride), at most one slot per
// object; XPACK_E_CAPACITY when that is fewer than top-k (every term in the message).
Result<SlotSizing> size_slots(const ObjectSource& src, const CacheOptions& opts,
                              const device::MemoryInfo& mem);

struct FrameSizing {
  uint32_t count = 0;   // host tier frames
  uint64_t stride = 0;  // bytes from one frame's start to the next (the aligned read size)
};
// floor(host_cache_bytes / stride), capped at the objects the device slots
// cannot hold plus the spare (0 when the slots hold every object);
// XPACK_E_INVALID_ARG when a non-zero request holds fewer than 2 frames (a tier
// asked for must not silently vanish).
Result<FrameSizing> size_frames(const ObjectSource& src, const CacheOptions& opts, uint32_t n_slots);

}  // namespace xpack::cache
