#include "io/staging_arena.h"

#include <algorithm>
#include <cerrno>
#include <numa.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/checked_math.h"
#include "io/alignment.h"
#include "io/huge_pages.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older glibc headers lack it
#endif
#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif

namespace xpack::io {
namespace {

constexpr uint64_t kGuard = kDirectIoAlign;

// Faults every page in (after the NUMA policy is set, which MAP_POPULATE would
// have preempted, and after MADV_HUGEPAGE, which only affects later faults).
// `may_touch`: whether touching is an acceptable fallback when the kernel lacks
// MADV_POPULATE_WRITE (5.14); for hugetlb pages bound to a node it is not, since a
// node without free huge pages turns the touch into SIGBUS, where the madvise
// returns an error.
bool populate(uint8_t* base, uint64_t bytes, bool may_touch) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return true;
#endif
  if (!may_touch) return false;
  for (uint64_t off = 0; off < bytes; off += kDirectIoAlign) base[off] = 0;
  return true;
}

struct Mapping {
  uint8_t* base = nullptr;      // usable, `align`-aligned, `len` bytes read-write
  uint8_t* map_base = nullptr;  // what to munmap
  uint64_t map_len = 0;
};

// An anonymous read-write range of `len` bytes aligned to `align`, with a
// PROT_NONE guard page on each side: the guards keep the kernel from merging the
// range with a neighbouring mapping of the same flags, so /proc/self/smaps
// reports on exactly this range (and an overrun faults instead of scribbling).
// Reserving len + align + guard and trimming is how to get 2 MiB alignment from
// mmap, which only promises the base page size.
Result<Mapping> map_guarded(uint64_t len, uint64_t align) {
  auto raw_len = checked_add(len, align + kGuard);
  if (!raw_len) return err(XPACK_E_LIMIT, "staging mapping of {} bytes overflows", len);
  void* raw = mmap(nullptr, *raw_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return errno_error("mmap of {} bytes of staging memory", len);
  auto* r = static_cast<uint8_t*>(raw);
  auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(r) + kGuard, align));
  uint8_t* end = r + *raw_len;
  uint8_t* keep_begin = base - kGuard;
  uint8_t* keep_end = base + len + kGuard;
  if (keep_begin > r) munmap(r, static_cast<size_t>(keep_begin - r));
  if (end > keep_end) munmap(keep_end, static_cast<size_t>(end - keep_end));
  // The read-write part is a fresh private mapping (MAP_FIXED over the reserve),
  // so it is charged as ordinary committed memory, as a plain mmap would be.
  void* p = mmap(base, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) {
    Error e = errno_error("mmap of {} bytes of staging memory", len);
    munmap(keep_begin, len + 2 * kGuard);
    return e;
  }
  return Mapping{base, keep_begin, len + 2 * kGuard};
}

std::string mib_text(uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} KiB", bytes >> 10);
}

}  // namespace

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

  // Slots keep their 4 KiB-rounded size: rounding each slot to 2 MiB would cost up
  // to 2 MiB per slot, while a read that crosses a huge-page boundary only costs
  // one more segment. Only the whole mapping is rounded (< 2 MiB extra in all).
  // Arenas under 2 MiB stay in small pages: rounding would multiply them.
  const uint64_t huge_total = align_up(*total, kHugePageBytes);
  const bool fits = huge_total >= *total && huge_total <= cfg.max_total_bytes;
  const bool want_huge = cfg.huge_pages && *total >= kHugePageBytes && fits;

  std::unique_ptr<StagingArena> a(new StagingArena());
  a->total_ = *total;
  a->slot_count_ = cfg.slot_count;
  a->slot_bytes_ = slot_bytes;
  a->huge_wanted_ = want_huge;
  auto bind_range = [&](uint8_t* p, uint64_t len) {
    // numa_tonode_memory mbinds the range to the node (MPOL_BIND); pages are then
    // faulted in on that node.
    if (bind) numa_tonode_memory(p, len, cfg.numa_node);
  };

  std::string why_small;
  // 1. hugetlb pages, when the administrator reserved enough of them: the kernel
  // guarantees them at mmap time (a private mapping reserves its pages).
  if (want_huge && hugetlb_free_pages(kHugePageBytes) >= huge_total / kHugePageBytes) {
    void* p = mmap(nullptr, huge_total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), -1, 0);
    if (p != MAP_FAILED) {
      auto* b = static_cast<uint8_t*>(p);
      bind_range(b, huge_total);
      if (populate(b, huge_total, /*may_touch=*/!bind)) {
        a->base_ = a->map_base_ = b;
        a->mapped_ = a->map_len_ = huge_total;
        a->page_source_ = PageSource::kHugetlb;
      } else {
        munmap(p, huge_total);  // e.g. the bound node has no free huge pages
      }
    }
  }
  // 2. Transparent huge pages: a 2 MiB-aligned range marked MADV_HUGEPAGE before
  // any page is faulted, so faults (and the populate below) take whole 2 MiB pages.
  const ThpMode thp = thp_mode();
  const bool thp_usable = thp == ThpMode::kAlways || thp == ThpMode::kMadvise;
  if (!a->base_ && want_huge && thp_usable && thp_page_bytes() == kHugePageBytes) {
    XPACK_ASSIGN_OR_RETURN(Mapping m, map_guarded(huge_total, kHugePageBytes));
    a->base_ = m.base;
    a->map_base_ = m.map_base;
    a->map_len_ = m.map_len;
    a->mapped_ = huge_total;
    a->page_source_ = PageSource::kTransparent;
    madvise(m.base, huge_total, MADV_HUGEPAGE);
    bind_range(m.base, huge_total);
    populate(m.base, huge_total, true);
  }
  // 3. Base pages.
  if (!a->base_) {
    if (!cfg.huge_pages) why_small = "huge pages switched off";
    else if (*total < kHugePageBytes) why_small = "arena smaller than 2 MiB";
    else if (!fits) why_small = "rounding to 2 MiB exceeds the size limit";
    else if (!thp_usable)
      why_small = fmt::format("transparent huge pages are {} and no hugetlb pages are free",
                              thp_mode_name(thp));
    else why_small = "transparent huge pages are not 2 MiB here";
    XPACK_ASSIGN_OR_RETURN(Mapping m, map_guarded(*total, kDirectIoAlign));
    a->base_ = m.base;
    a->map_base_ = m.map_base;
    a->map_len_ = m.map_len;
    a->mapped_ = *total;
    a->page_source_ = PageSource::kSmall;
    // Forced small pages must stay small even where THP is "always".
    if (!cfg.huge_pages) madvise(m.base, *total, MADV_NOHUGEPAGE);
    bind_range(m.base, *total);
    populate(m.base, *total, true);
  }

  auto measure = [&] {
    PageBacking b = measure_backing(a->base_);
    if (!b.known || a->mapped_ == 0) {
      a->page_bytes_ = 0;
      a->huge_fraction_ = 0;
      return;
    }
    a->huge_fraction_ = std::min(1.0, double(b.huge_bytes) / double(a->mapped_));
    const uint64_t base_page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (a->page_source_ == PageSource::kHugetlb) a->page_bytes_ = b.kernel_page_bytes;
    else a->page_bytes_ = a->huge_fraction_ >= 0.5 ? thp_page_bytes() : base_page;
  };
  measure();
  // Where faults found no free 2 MiB page (fragmented memory, defrag settings),
  // ask the kernel once to collapse the range synchronously (Linux 6.1+; EINVAL
  // before), before anything pins the pages.
  if (a->page_source_ == PageSource::kTransparent && a->huge_fraction_ < 1.0 &&
      madvise(a->base_, a->mapped_, MADV_COLLAPSE) == 0)
    measure();

  const int pct = static_cast<int>(a->huge_fraction_ * 100.0 + 0.5);
  if (a->page_bytes_ == 0) {
    a->page_text_ = "page size unknown (/proc/self/smaps unreadable)";
  } else if (a->page_source_ == PageSource::kHugetlb) {
    a->page_text_ = fmt::format("{} pages (hugetlb)", mib_text(a->page_bytes_));
  } else if (a->page_source_ == PageSource::kTransparent) {
    a->page_text_ = a->huge_fraction_ >= 0.5
                        ? fmt::format("{} pages (transparent, {}% of {})", mib_text(a->page_bytes_), pct,
                                      mib_text(a->mapped_))
                        : fmt::format("{} pages: only {}% of {} got transparent huge pages",
                                      mib_text(a->page_bytes_), pct, mib_text(a->mapped_));
  } else {
    a->page_text_ = fmt::format("{} pages: {}", mib_text(a->page_bytes_), why_small);
    if (a->huge_fraction_ > 0) a->page_text_ += fmt::format(" ({}% in huge pages anyway)", pct);
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
  if (map_base_) munmap(map_base_, map_len_);
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
