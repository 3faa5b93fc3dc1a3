// Pinned-for-I/O staging memory: N slots of equal size, each 4096-aligned, in one
// anonymous mapping (io_uring requires anonymous memory for registered buffers),
// optionally bound to a NUMA node (staging should sit on the GPU's node).
#pragma once
#include <cstdint>
#include <memory>
#include <sys/uio.h>
#include <vector>

#include "common/result.h"
#include "io/host_registrar.h"

namespace xpack::io {

// io_uring's limit per registered buffer.
inline constexpr uint64_t kMaxRegisteredBuffer = 1ull << 30;

struct ArenaConfig {
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;  // rounded up to 4096
  int numa_node = -1;       // -1: wherever the kernel puts it
  // Cap on the whole arena; a sanity limit against hostile/erroneous sizes.
  uint64_t max_total_bytes = 1ull << 40;
};

class StagingArena {
 public:
  static Result<std::unique_ptr<StagingArena>> create(const ArenaConfig& cfg);
  ~StagingArena();
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t total_bytes() const { return total_; }
  uint32_t slot_count() const { return slot_count_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot(uint32_t i) const { return base_ + static_cast<uint64_t>(i) * slot_bytes_; }

  // The iovecs to register with io_uring: each slot is cut into pieces of at most
  // kMaxRegisteredBuffer, so a read that stays inside one piece has one index.
  const std::vector<iovec>& iovecs() const { return iovecs_; }
  // Registered-buffer index of the piece holding [p, p+len), or -1 if the range
  // crosses pieces or lies outside the arena.
  int buffer_index(const uint8_t* p, uint64_t len) const;
  uint64_t pieces_per_slot() const { return pieces_per_slot_; }

  // Pins the arena for a device backend; undone on destruction.
  Status attach_registrar(HostMemoryRegistrar* r);

 private:
  StagingArena() = default;
  uint8_t* base_ = nullptr;
  uint64_t total_ = 0;
  uint32_t slot_count_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t pieces_per_slot_ = 1;
  std::vector<iovec> iovecs_;
  HostMemoryRegistrar* registrar_ = nullptr;
};

}  // namespace xpack::io
