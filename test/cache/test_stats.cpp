// Telemetry: histogram buckets, consistent snapshots, JSON, atomic file writes.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "stats/stats_json.h"

using namespace xpack;
using namespace xpack::stats;

TEST_CASE("histogram: log-linear buckets, quantiles within 6.25 %, sums") {
  LatencyHistogram h;
  CHECK(h.quantile_ns(0.5) == 0);
  h.record(0);
  h.record(1);
  h.record(1000);     // 2^9 <= 1000 < 2^10, sub-bucket [992, 1024)
  h.record(1u << 20);
  CHECK(h.count() == 4);
  CHECK(h.sum_ns() == 1 + 1000 + (1u << 20));
  CHECK(h.max_ns() == (1u << 20));
  CHECK(h.quantile_ns(0.5) == 1);             // values below 16 are exact
  CHECK(h.quantile_ns(0.75) == 1023);         // was 1024 (the power of two above)
  CHECK(h.quantile_ns(1.0) == (1u << 20) + (1u << 16) - 1);
  const auto log2 = h.log2_counts();
  CHECK(log2[0] == 2);
  CHECK(log2[9] == 1);
  CHECK(log2[20] == 1);
  h.record(UINT64_MAX);
  CHECK(h.quantile_ns(1.0) == UINT64_MAX);
  CHECK(h.max_ns() == UINT64_MAX);

  // Every value is reported within [v, v * (1 + 1/16)): the resolution the
  // stats JSON and xpack_cache_counters promise.
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 20000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const uint64_t v = x >> (x % 60);
    LatencyHistogram one;
    one.record(v);
    const uint64_t got = one.quantile_ns(0.5);
    REQUIRE(got >= v);
    REQUIRE(double(got - v) < double(v) / 16.0 + 1.0);
  }
  LatencyHistogram a, b;
  a.record(10);
  b.record(5000);
  a.merge(b);
  CHECK(a.count() == 2);
  CHECK(a.sum_ns() == 5010);
  CHECK(a.max_ns() == 5000);
}

TEST_CASE("telemetry: snapshots taken during concurrent updates are consistent") {
  Telemetry t(2);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w)
    writers.emplace_back([&, w] {
      for (int i = 0; i < 20000; ++i)
        t.update([&](Counters& c) {
          // One miss = one read of 4096 bytes, counted together.
          ++c.cache_misses;
          ++c.misses_by_layer[w % 2];
          ++c.pack_reads;
          c.pack_read_bytes += 4096;
        });
    });
  int checked = 0;
  while (checked < 2000) {
    auto s = t.snapshot();
    REQUIRE(s.pack_read_bytes == s.pack_reads * 4096);
    REQUIRE(s.cache_misses == s.misses_by_layer[0] + s.misses_by_layer[1]);
    ++checked;
  }
  for (auto& th : writers) th.join();
  auto s = t.snapshot();
  CHECK(s.cache_misses == 60000);
  CHECK(s.pack_read_bytes == 60000ull * 4096);
}

TEST_CASE("stats json: keys and derived values") {
  Counters c;
  c.cache_hits = 3;
  c.cache_misses = 1;
  c.route_calls_by_layer = {2, 0};
  c.read_latency.record(2'000'000);
  auto j = counters_to_json(c);
  CHECK(j["cache_hits"] == 3);
  CHECK(j["hit_rate"].get<double>() == doctest::Approx(0.75));
  CHECK(j["route_calls_by_layer"].size() == 2);
  CHECK(j["mean_read_ms"].get<double>() == doctest::Approx(2.0));
  CHECK(j["read_latency"]["log2_ns_buckets"].size() == 21);  // 2e6 is in bucket 20
  for (const char* k : {"cache_misses", "cache_evictions", "pack_read_bytes", "h2d_bytes",
                        "fallback_count", "io_errors", "prefetch_issued", "prefetch_used",
                        "prefetch_wasted", "stall_ns", "route_tokens_by_layer", "h2d_latency",
                        "staging_page_bytes", "staging_huge_fraction"})
    CHECK_MESSAGE(j.contains(k), k);
}

TEST_CASE("atomic write: replaces the file, leaves no temporary, fails cleanly") {
  test::TempDir dir;
  auto path = (dir / "stats.json").string();
  REQUIRE(write_file_atomic(path, "{\"a\":1}").ok());
  REQUIRE(write_file_atomic(path, "{\"a\":2}").ok());
  auto b = test::read_file(path);
  CHECK(std::string(b.begin(), b.end()) == "{\"a\":2}");
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);
  auto bad = write_file_atomic((dir / "no/such/dir/x.json").string(), "x");
  CHECK_FALSE(bad.ok());
  CHECK(bad.error().code == -ENOENT);
}
