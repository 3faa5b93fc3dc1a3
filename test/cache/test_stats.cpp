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

TEST_CASE("histogram: log2 buckets, quantiles, sums") {
  Log2Histogram h;
  CHECK(h.quantile_upper_ns(0.5) == 0);
  h.record(0);
  h.record(1);
  h.record(1000);     // 2^9 <= 1000 < 2^10
  h.record(1u << 20);
  CHECK(Log2Histogram::bucket_of(1000) == 9);
  CHECK(h.buckets()[0] == 2);
  CHECK(h.buckets()[9] == 1);
  CHECK(h.buckets()[20] == 1);
  CHECK(h.count() == 4);
  CHECK(h.sum_ns() == 1 + 1000 + (1u << 20));
  CHECK(h.max_ns() == (1u << 20));
  CHECK(h.quantile_upper_ns(0.5) == 2);       // 2nd of 4 values is in bucket 0
  CHECK(h.quantile_upper_ns(0.75) == 1024);
  CHECK(h.quantile_upper_ns(1.0) == (2u << 20));
  h.record(UINT64_MAX);
  CHECK(Log2Histogram::bucket_of(UINT64_MAX) == 63);
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
