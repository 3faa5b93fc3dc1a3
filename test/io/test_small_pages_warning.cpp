// The small-pages warning of xpack-run and bench-cache (tools/small_pages_warning.h):
// said when staging got 4 KiB pages and the reads are large enough to be split.
#include <doctest/doctest.h>

#include "small_pages_warning.h"

using xpack::tools::small_pages_warning;

TEST_CASE("warned: 4 KiB pages under reads of 1 MiB or more") {
  const std::string w = small_pages_warning(4096, 0.0, 13'369'344);
  CHECK(w.find("4 KiB pages") != std::string::npos);
  CHECK(w.find("0% in huge pages") != std::string::npos);
  CHECK(w.find("13369344 bytes spans 3264 pages") != std::string::npos);
  CHECK(w.find("vm.nr_hugepages") != std::string::npos);
  CHECK(!small_pages_warning(4096, 0.3, 1 << 20).empty());  // exactly 256 pages
  CHECK(small_pages_warning(4096, 0.3, 1 << 20).find("30% in huge pages") != std::string::npos);
  CHECK(!small_pages_warning(65536, 0.0, 64u << 20).empty());  // 64 KiB base pages (arm64)
}

TEST_CASE("nothing said: huge pages, an unknown page size, small reads") {
  CHECK(small_pages_warning(2u << 20, 1.0, 13'369'344).empty());
  CHECK(small_pages_warning(1u << 30, 1.0, 13'369'344).empty());  // 1 GiB hugetlb pages
  CHECK(small_pages_warning(0, 0.0, 13'369'344).empty());          // smaps unreadable
  CHECK(small_pages_warning(4096, 0.0, (1 << 20) - 1).empty());    // fits the segments
  CHECK(small_pages_warning(4096, 0.0, 0).empty());
}
