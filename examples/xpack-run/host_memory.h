// How much host memory this process may still take, for the default size of
// the expert cache's host tier: the kernel's MemAvailable, lowered by every
// memory cgroup limit above the process (a container or a systemd slice caps
// it below what the machine has; pinned memory beyond the cap gets the process
// killed, not swapped).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace xrun {

struct HostMemory {
  uint64_t available_bytes = 0;
  std::string limited_by;  // "MemAvailable" or the cgroup directory that bounds it
};

HostMemory available_host_memory();

// The default host tier: 3/4 of what is available above 1 GiB (on a 32 GB PC
// with about 28 GB available, 20 GB), leaving room for the OS, the page cache
// the trunk is read through, and growth.
uint64_t default_host_tier_bytes(uint64_t available_bytes);

// Parsers, exposed for tests. MemAvailable of /proc/meminfo in bytes.
std::optional<uint64_t> parse_mem_available(const std::string& meminfo);
// What a cgroup v2 directory still grants: memory.max minus the usage that
// cannot be reclaimed (memory.current minus the "file" pages of memory.stat,
// which the kernel drops under pressure). nullopt for "max" (no limit) or
// unreadable values.
std::optional<uint64_t> cgroup_headroom(const std::string& memory_max, const std::string& memory_current,
                                        const std::string& memory_stat);

}  // namespace xrun
