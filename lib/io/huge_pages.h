// What the kernel offers for backing staging memory with 2 MiB pages, and what a
// mapping actually got. A 1 MiB O_DIRECT read into 4 KiB pages is 256 segments,
// above the max_segments (often 254) of NVMe queues, so the block layer splits
// every such read; in huge pages it is one or two segments.
#pragma once
#include <cstdint>
#include <string>

namespace xpack::io {

enum class ThpMode { kAlways, kMadvise, kNever, kAbsent };

// /sys/kernel/mm/transparent_hugepage/enabled (the bracketed word); kAbsent
// when the file is missing (kernel without THP) or unreadable.
ThpMode thp_mode();
const char* thp_mode_name(ThpMode m);

// Size of a PMD-mapped transparent huge page (2 MiB on x86-64), 0 if unknown.
uint64_t thp_page_bytes();

// Free pages in the hugetlb pool of `page_bytes` pages (0 if none configured).
uint64_t hugetlb_free_pages(uint64_t page_bytes);

// How a mapping is backed, from /proc/self/smaps.
struct PageBacking {
  bool known = false;          // false: the mapping was not found in smaps
  uint64_t mapping_bytes = 0;  // Size of the VMA starting at the address
  uint64_t kernel_page_bytes = 0;  // KernelPageSize (2 MiB for hugetlb)
  uint64_t huge_bytes = 0;     // AnonHugePages, or the whole hugetlb mapping
};

// The VMA that starts exactly at `base`. The caller keeps its mapping a VMA of
// its own (guard pages around it), so neighbours do not merge into the figures.
PageBacking measure_backing(const void* base);

}  // namespace xpack::io
