// Pinned-for-I/O staging memory: N slots of equal size, each 4096-aligned, in one
// anonymous mapping (io_uring requires anonymous memory for registered buffers),
// backed by 2 MiB pages where the system allows, optionally bound to a NUMA node
// (staging should sit on the GPU's node).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <sys/uio.h>
#include <vector>

#include "common/result.h"
#include "io/host_registrar.h"

namespace xpack::io {

// io_uring's limit per registered buffer.
inline constexpr uint64_t kMaxRegisteredBuffer = 1ull << 30;
// The huge page size the arena asks for (hugetlb) and rounds to.
inline constexpr uint64_t kHugePageBytes = 2ull << 20;

struct ArenaConfig {
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;  // rounded up to 4096
  int numa_node = -1;       // -1: wherever the kernel puts it
  // Cap on the whole arena; a sanity limit against hostile/erroneous sizes. It
  // applies to the requested bytes; the 2 MiB rounding for huge pages is only
  // done when the rounded size fits it too (else 4 KiB pages).
  uint64_t max_total_bytes = 1ull << 40;
  // false: 4 KiB pages even where huge pages are available (diagnostics: measures
  // what huge pages bring on the same machine).
  bool huge_pages = true;
};

// How the arena ended up backed.
enum class PageSource {
  kHugetlb,      // MAP_HUGETLB from the hugetlb pool
  kTransparent,  // 2 MiB-aligned mapping with MADV_HUGEPAGE
  kSmall,        // plain mapping: 4 KiB pages unless THP "always" gave more
};

class StagingArena {
 public:
  static Result<std::unique_ptr<StagingArena>> create(const ArenaConfig& cfg);
  ~StagingArena();
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  uint8_t* base() const { return base_; }
  // Bytes of the slots (slot_count x slot_bytes).
  uint64_t total_bytes() const { return total_; }
  // Bytes mapped and populated: total_bytes rounded up to 2 MiB with huge pages.
  // The kernel charges whole huge pages to RLIMIT_MEMLOCK, so this is what
  // registration needs.
  uint64_t mapped_bytes() const { return mapped_; }
  uint32_t slot_count() const { return slot_count_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot(uint32_t i) const { return base_ + static_cast<uint64_t>(i) * slot_bytes_; }

  // The page size backing most of the arena as measured after populating it
  // (/proc/self/smaps): 2 MiB when at least half is in huge pages, else the base
  // page size; 0 when it could not be measured.
  uint64_t page_bytes() const { return page_bytes_; }
  // Fraction of mapped_bytes in huge pages (0..1).
  double huge_fraction() const { return huge_fraction_; }
  PageSource page_source() const { return page_source_; }
  // Whether huge pages were asked for and the arena is large enough to use them
  // (at least 2 MiB): when true and huge_fraction() < 1, tools should warn.
  bool huge_wanted() const { return huge_wanted_; }
  // One line for humans: "2 MiB pages (transparent, 100%)", "4 KiB pages: THP is
  // never and no hugetlb pages are configured", ...
  const std::string& page_description() const { return page_text_; }

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
  uint64_t mapped_ = 0;
  uint8_t* map_base_ = nullptr;  // what munmap gets: base_ minus a guard page, or base_
  uint64_t map_len_ = 0;
  uint32_t slot_count_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t pieces_per_slot_ = 1;
  uint64_t page_bytes_ = 0;
  double huge_fraction_ = 0;
  PageSource page_source_ = PageSource::kSmall;
  bool huge_wanted_ = false;
  std::string page_text_;
  std::vector<iovec> iovecs_;
  HostMemoryRegistrar* registrar_ = nullptr;
};

}  // namespace xpack::io
