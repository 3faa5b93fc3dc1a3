// The warning xpack-run and bench-cache print on stderr when the I/O staging memory
// could only get small (4 KiB) pages: a read of 1 MiB or more then spans more pages
// than an NVMe queue takes segments (254 on the machines measured, often fewer), and
// the block layer splits it (doc/io.md, "Staging arena"; doc/benchmarks.md measured
// 1.6 vs 2.2 GB/s). The library prints nothing; the numbers come from the counters
// (staging_page_bytes, staging_huge_fraction). Header-only, no library calls.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace xpack::tools {

// Reads below this many bytes fit in the segments of any NVMe queue even in 4 KiB pages.
inline constexpr uint64_t kSplitReadBytes = uint64_t{1} << 20;
inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

// The warning's text, or "" when there is nothing to say: the page size is unknown (0),
// huge, or the reads are too small to be split.
inline std::string small_pages_warning(uint64_t page_bytes, double huge_fraction, uint64_t read_bytes) {
  if (page_bytes == 0 || page_bytes >= kHugePageBytes || read_bytes < kSplitReadBytes) return "";
  const uint64_t pages = (read_bytes + page_bytes - 1) / page_bytes;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "staging memory in %llu KiB pages (%.0f%% in huge pages): each read of %llu bytes spans %llu "
                "pages, more than NVMe max_segments, and is split (set transparent huge pages to madvise or "
                "always, or reserve hugetlb pages: vm.nr_hugepages)",
                static_cast<unsigned long long>(page_bytes >> 10), huge_fraction * 100.0,
                static_cast<unsigned long long>(read_bytes), static_cast<unsigned long long>(pages));
  return buf;
}

}  // namespace xpack::tools
