#include "host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace xrun {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::optional<uint64_t> parse_u64(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  if (i == s.size() || s[i] < '0' || s[i] > '9') return std::nullopt;
  uint64_t v = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    if (v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + uint64_t(s[i] - '0');
  }
  return v;
}

}  // namespace

std::optional<uint64_t> parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    auto kib = parse_u64(line.substr(13));
    if (!kib || *kib > UINT64_MAX / 1024) return std::nullopt;
    return *kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> cgroup_headroom(const std::string& memory_max, const std::string& memory_current,
                                        const std::string& memory_stat) {
  auto max = parse_u64(memory_max);
  auto current = parse_u64(memory_current);
  if (!max || !current) return std::nullopt;  // "max": unlimited
  uint64_t file = 0;
  std::istringstream in(memory_stat);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("file ", 0) == 0) file = parse_u64(line.substr(5)).value_or(0);
  const uint64_t held = *current - std::min(file, *current);
  return *max > held ? *max - held : 0;
}

HostMemory available_host_memory() {
  HostMemory m;
  m.available_bytes = parse_mem_available(slurp("/proc/meminfo")).value_or(0);
  m.limited_by = "MemAvailable";
  // cgroup v2: "0::/path". Every ancestor's limit applies too.
  std::istringstream in(slurp("/proc/self/cgroup"));
  std::string line, path;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  while (!path.empty()) {
    const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
    auto room = cgroup_headroom(slurp(dir + "/memory.max"), slurp(dir + "/memory.current"), slurp(dir + "/memory.stat"));
    if (room && *room < m.available_bytes) {
      m.available_bytes = *room;
      m.limited_by = "cgroup " + dir;
    }
    if (path == "/") break;
    const size_t cut = path.find_last_of('/');
    path = cut == 0 || cut == std::string::npos ? "/" : path.substr(0, cut);
  }
  return m;
}

uint64_t default_host_tier_bytes(uint64_t available_bytes) {
  constexpr uint64_t kKeep = uint64_t(1) << 30;
  return available_bytes > kKeep ? (available_bytes - kKeep) / 4 * 3 : 0;
}

}  // namespace xrun
