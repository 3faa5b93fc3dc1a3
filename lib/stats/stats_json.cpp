#include "stats/stats_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

namespace xpack::stats {
namespace {

nlohmann::ordered_json histogram_json(const LatencyHistogram& h) {
  nlohmann::ordered_json j;
  j["count"] = h.count();
  j["sum_ns"] = h.sum_ns();
  j["max_ns"] = h.max_ns();
  j["mean_ns"] = h.count() ? double(h.sum_ns()) / double(h.count()) : 0.0;
  // Upper bounds of the buckets holding them: within 6.25 % above the true value.
  j["p50_ns_upper"] = h.quantile_ns(0.5);
  j["p99_ns_upper"] = h.quantile_ns(0.99);
  j["p999_ns_upper"] = h.quantile_ns(0.999);
  const auto log2 = h.log2_counts();
  int last = -1;
  for (int i = 0; i < LatencyHistogram::kLog2Buckets; ++i)
    if (log2[i]) last = i;
  auto b = nlohmann::ordered_json::array();
  for (int i = 0; i <= last; ++i) b.push_back(log2[i]);
  j["log2_ns_buckets"] = b;
  return j;
}

Status write_all(int fd, const std::string& text, const std::string& path) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("write {}", path);
    }
    off += size_t(n);
  }
  return {};
}

}  // namespace

nlohmann::ordered_json counters_to_json(const Counters& c) {
  nlohmann::ordered_json j;
  j["cache_hits"] = c.cache_hits;
  j["cache_misses"] = c.cache_misses;
  uint64_t lookups = c.cache_hits + c.cache_misses;
  j["hit_rate"] = lookups ? double(c.cache_hits) / double(lookups) : 0.0;
  j["cache_evictions"] = c.cache_evictions;
  j["pack_reads"] = c.pack_reads;
  j["pack_read_bytes"] = c.pack_read_bytes;
  j["h2d_bytes"] = c.h2d_bytes;
  j["fallback_count"] = c.fallback_count;
  j["io_errors"] = c.io_errors;
  j["prefetch_issued"] = c.prefetch_issued;
  j["prefetch_used"] = c.prefetch_used;
  j["prefetch_wasted"] = c.prefetch_wasted;
  j["acquires"] = c.acquires;
  j["steps"] = c.steps;
  j["stall_ns"] = c.stall_ns;
  j["stall_waits"] = c.stall_waits;
  j["trace_write_errors"] = c.trace_write_errors;
  j["host_hits"] = c.host_hits;
  j["host_demotions"] = c.host_demotions;
  j["host_evictions"] = c.host_evictions;
  j["d2h_bytes"] = c.d2h_bytes;
  j["ssd_busy_ns"] = c.ssd_busy_ns;
  // Hits of either tier over all lookups: what the SSD was spared.
  j["hit_rate_with_host"] = lookups ? double(c.cache_hits + c.host_hits) / double(lookups) : 0.0;
  j["staging_page_bytes"] = c.staging_page_bytes;
  j["staging_huge_fraction"] = c.staging_huge_fraction;
  j["mean_read_ms"] =
      c.read_latency.count() ? double(c.read_latency.sum_ns()) / c.read_latency.count() / 1e6 : 0.0;
  j["route_calls_by_layer"] = c.route_calls_by_layer;
  j["route_tokens_by_layer"] = c.route_tokens_by_layer;
  j["hits_by_layer"] = c.hits_by_layer;
  j["misses_by_layer"] = c.misses_by_layer;
  j["read_latency"] = histogram_json(c.read_latency);
  j["h2d_latency"] = histogram_json(c.h2d_latency);
  return j;
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path target(path);
  std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  std::string tmp = (dir / (target.filename().string() + ".tmp." + std::to_string(::getpid()) +
                            "." + std::to_string(counter++)))
                        .string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("create {}", tmp);
  Status st = write_all(fd, text, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = errno_error("fsync {}", tmp);
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = errno_error("rename to {}", path);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: the rename is already visible
    ::close(dfd);
  }
  return {};
}

}  // namespace xpack::stats
