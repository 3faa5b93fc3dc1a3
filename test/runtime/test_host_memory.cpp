// xpack-run's host memory probe (host_memory.h), behind the host tier's default:
// /proc/meminfo and cgroup v2 files parsed from text, including malformed and
// hostile values, then the live machine.
#include <doctest/doctest.h>

#include "../../examples/xpack-run/host_memory.h"

using namespace xrun;

TEST_CASE("host memory: MemAvailable from /proc/meminfo text") {
  CHECK(parse_mem_available("MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n") ==
        uint64_t(20000000) * 1024);
  CHECK_FALSE(parse_mem_available("MemTotal: 5 kB\n"));
  CHECK_FALSE(parse_mem_available(""));
  CHECK_FALSE(parse_mem_available("MemAvailable: lots kB\n"));
  CHECK_FALSE(parse_mem_available("MemAvailable: 99999999999999999999999 kB\n"));  // overflow
  CHECK_FALSE(parse_mem_available("MemAvailable: 18014398509481984 kB\n"));       // x1024 overflows
  CHECK(parse_mem_available("Mem: 1 kB\nMemAvailable:\t7 kB") == 7168);
}

TEST_CASE("host memory: a cgroup's headroom counts its page cache as reclaimable") {
  const std::string stat = "anon 1000\nfile 3000\nkernel 10\n";
  CHECK(cgroup_headroom("10000\n", "5000\n", stat) == 10000 - 2000);
  CHECK(cgroup_headroom("max\n", "5000\n", stat) == std::nullopt);  // no limit
  CHECK(cgroup_headroom("4000\n", "9000\n", "file 1000\n") == 0u);   // over its limit
  CHECK(cgroup_headroom("4000", "1000", "") == 3000u);                 // no memory.stat
  CHECK(cgroup_headroom("4000", "1000", "file 5000\n") == 4000u);      // file above current
  CHECK_FALSE(cgroup_headroom("", "1000", ""));
  CHECK_FALSE(cgroup_headroom("4000", "-1", ""));
}

TEST_CASE("host memory: the default tier is 3/4 above 1 GiB") {
  const uint64_t gib = uint64_t(1) << 30;
  CHECK(default_host_tier_bytes(0) == 0);
  CHECK(default_host_tier_bytes(gib) == 0);
  CHECK(default_host_tier_bytes(5 * gib) == 3 * gib);
  CHECK(default_host_tier_bytes(28 * gib) == (27 * gib) / 4 * 3);
}

TEST_CASE("host memory: this machine reports something plausible") {
  const HostMemory m = available_host_memory();
  CHECK(m.available_bytes > 0);
  CHECK(!m.limited_by.empty());
}
