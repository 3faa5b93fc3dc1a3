#include "cache/sizing.h"

#include <algorithm>

#include "common/checked_math.h"

namespace xpack::cache {

Status check_options(const ObjectSource& src, const CacheOptions& opts) {
  if (src.n_layers == 0 || src.n_experts == 0 || src.object_bytes == 0 || !src.offset)
    return err(XPACK_E_INVALID_ARG, "cache: empty object source");
  if (src.read_bytes < src.object_bytes || src.read_bytes % 4096 != 0)
    return err(XPACK_E_MISALIGNED, "cache: read size {} must be a multiple of 4096 >= {}",
               src.read_bytes, src.object_bytes);
  if (is_offline(opts.policy))
    return err(XPACK_E_INVALID_ARG, "cache: {} needs the whole trace in advance; it exists in xpack-sim only",
               policy_name(opts.policy));
  if (opts.staging_slots == 0 || opts.staging_slots > kMaxStagingBuffers)
    return err(XPACK_E_INVALID_ARG, "cache: staging_slots must be 1..{}", kMaxStagingBuffers);
  // The engine's limit, checked here too so that a bad value is refused before
  // the slots are allocated.
  if (opts.read_splits == 0 || opts.read_splits > io::kMaxReadSplits)
    return err(XPACK_E_INVALID_ARG, "cache: read_splits must be 1..{}", io::kMaxReadSplits);
  if (opts.verify && !src.checksum)
    return err(XPACK_E_INVALID_ARG, "cache: verification needs object checksums");
  return {};
}

Result<SlotSizing> size_slots(const ObjectSource& src, const CacheOptions& opts,
                              const device::MemoryInfo& mem) {
  uint64_t avail = mem.free_bytes > opts.reserve_bytes ? mem.free_bytes - opts.reserve_bytes : 0;
  uint64_t budget = opts.budget_bytes ? std::min(opts.budget_bytes, avail) : avail;
  SlotSizing out;
  out.stride = align_up(src.object_bytes, kSlotAlignment);
  uint64_t all_objects = uint64_t(src.n_layers) * src.n_experts;
  uint64_t slots = std::min<uint64_t>(budget / out.stride, all_objects);
  uint64_t need = std::max<uint32_t>(src.top_k, 1);
  if (slots < need)
    return err(XPACK_E_CAPACITY,
               "cache: a budget of {} bytes (requested {}, free {}, reserve {}) holds {} slots of "
               "{} bytes, fewer than top-k = {}",
               budget, opts.budget_bytes, mem.free_bytes, opts.reserve_bytes, slots, out.stride,
               need);
  out.count = uint32_t(std::min<uint64_t>(slots, UINT32_MAX));
  return out;
}

Result<FrameSizing> size_frames(const ObjectSource& src, const CacheOptions& opts, uint32_t n_slots) {
  FrameSizing out;
  out.stride = src.read_bytes;
  if (opts.host_cache_bytes == 0) return out;
  uint64_t frames = opts.host_cache_bytes / out.stride;
  if (frames < 2)
    return err(XPACK_E_INVALID_ARG,
               "cache: a host tier of {} bytes holds {} frames of {} bytes (one object each), fewer "
               "than 2 (one frame is kept free for swaps); ask for at least {} bytes, or 0 for no tier",
               opts.host_cache_bytes, frames, out.stride, 2 * out.stride);
  const uint64_t objects = uint64_t(src.n_layers) * src.n_experts;
  const uint64_t beyond = objects - std::min<uint64_t>(n_slots, objects);
  out.count = uint32_t(std::min<uint64_t>({frames, beyond + 1, UINT32_MAX}));
  if (beyond == 0) out.count = 0;  // the slots hold every object: nothing to extend
  return out;
}

}  // namespace xpack::cache
