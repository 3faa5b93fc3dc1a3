#include "io/staging_arena.h"

#include <algorithm>
#include <numa.h>
#include <sys/mman.h>

#include "common/checked_math.h"
#include "io/alignment.h"

namespace xpack::io {

// Touches every page so the memory is resident (after the NUMA policy is set,
// which MAP_POPULATE would have preempted).
static Status populate(uint8_t* base, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return {};
#endif
  for (uint64_t off = 0; off < bytes; off += kDirectIoAlign) base[off] = 0;
  return {};
}

Result<std::unique_ptr<StagingArena>> StagingArena::create(const ArenaConfig& cfg) {
  if (cfg.slot_count == 0) return err(XPACK_E_INVALID_ARG, "staging arena needs at least one slot");
  if (cfg.slot_bytes == 0) return err(XPACK_E_INVALID_ARG, "staging slot size is 0");
  const uint64_t slot_bytes = align_up(cfg.slot_bytes, kDirectIoAlign);
  if (slot_bytes < cfg.slot_bytes) return err(XPACK_E_LIMIT, "staging slot size overflows");
  auto total = checked_mul(slot_bytes, cfg.slot_count);
  if (!total || *total > cfg.max_total_bytes)
    return err(XPACK_E_LIMIT, "staging arena of {} slots x {} bytes exceeds the {} byte limit",
               cfg.slot_count, slot_bytes, cfg.max_total_bytes);

  const bool bind = cfg.numa_node >= 0;
  if (bind) {
    if (numa_available() < 0)
      return err(XPACK_E_UNSUPPORTED, "NUMA node {} requested but libnuma reports no NUMA support",
                 cfg.numa_node);
    if (cfg.numa_node > numa_max_node())
      return err(XPACK_E_INVALID_ARG, "NUMA node {} does not exist (max node {})", cfg.numa_node,
                 numa_max_node());
  }

  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (bind ? 0 : MAP_POPULATE);
  void* p = mmap(nullptr, *total, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return errno_error("mmap of {} bytes of staging memory", *total);

  std::unique_ptr<StagingArena> a(new StagingArena());
  a->base_ = static_cast<uint8_t*>(p);
  a->total_ = *total;
  a->slot_count_ = cfg.slot_count;
  a->slot_bytes_ = slot_bytes;

  if (bind) {
    // numa_tonode_memory mbinds the range to the node (MPOL_BIND); pages are then
    // faulted in on that node.
    numa_tonode_memory(p, *total, cfg.numa_node);
    XPACK_TRY(populate(a->base_, *total));
  }

  a->pieces_per_slot_ = (slot_bytes + kMaxRegisteredBuffer - 1) / kMaxRegisteredBuffer;
  a->iovecs_.reserve(a->pieces_per_slot_ * cfg.slot_count);
  for (uint32_t s = 0; s < cfg.slot_count; ++s) {
    for (uint64_t off = 0; off < slot_bytes; off += kMaxRegisteredBuffer) {
      uint64_t len = std::min<uint64_t>(kMaxRegisteredBuffer, slot_bytes - off);
      a->iovecs_.push_back({a->slot(s) + off, len});
    }
  }
  return a;
}

StagingArena::~StagingArena() {
  if (registrar_) registrar_->unregister_host(base_);
  if (base_) munmap(base_, total_);
}

int StagingArena::buffer_index(const uint8_t* p, uint64_t len) const {
  if (p < base_ || len == 0) return -1;
  uint64_t off = static_cast<uint64_t>(p - base_);
  if (off >= total_ || len > total_ - off) return -1;
  uint64_t slot = off / slot_bytes_;
  uint64_t in_slot = off % slot_bytes_;
  uint64_t piece = in_slot / kMaxRegisteredBuffer;
  uint64_t piece_end = std::min<uint64_t>((piece + 1) * kMaxRegisteredBuffer, slot_bytes_);
  if (in_slot + len > piece_end) return -1;
  return static_cast<int>(slot * pieces_per_slot_ + piece);
}

Status StagingArena::attach_registrar(HostMemoryRegistrar* r) {
  if (!r) return err(XPACK_E_INVALID_ARG, "null host memory registrar");
  if (registrar_) return err(XPACK_E_INVALID_ARG, "staging arena already has a registrar");
  XPACK_TRY(r->register_host(base_, total_));
  registrar_ = r;
  return {};
}

}  // namespace xpack::io
