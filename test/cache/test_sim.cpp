// xpack-sim end to end: the tool built in this tree on a hand-computed trace.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "xpack/xpack.h"

using namespace xpack::test;

namespace {
std::string sim() { return (build_dir() / "tools" / "xpack-sim").string(); }
}  // namespace

TEST_CASE("xpack-sim --json reports per policy and per layer") {
  TempDir dir;
  auto trace = dir / "t.csv";
  std::string csv = "step,layer,expert\n";
  for (auto [s, e] : std::initializer_list<std::pair<int, int>>{
           {0, 1}, {1, 2}, {2, 3}, {3, 1}, {4, 4}, {5, 2}, {6, 5}, {7, 1}, {8, 2}, {9, 3}})
    csv += std::to_string(s) + ",0," + std::to_string(e) + "\n";
  write_file(trace, std::vector<uint8_t>(csv.begin(), csv.end()));
  std::string out;
  REQUIRE(run_command(sim() + " --trace " + trace.string() + " --capacity 3 --json", &out) == 0);
  auto j = nlohmann::json::parse(out);
  CHECK(j["policies"]["lru"]["hits"] == 2);
  CHECK(j["policies"]["lru"]["misses"] == 8);
  CHECK(j["policies"]["lfu"]["hits"] == 3);
  CHECK(j["policies"]["hybrid"]["hits"] == 3);
  CHECK(j["policies"]["belady"]["hits"] == 4);
  // Keys 1 and 2 are requested 3 times, 3 twice, 4 and 5 once: kept in that order,
  // this trace gives the oracle LFU Belady's 4 hits.
  CHECK(j["policies"]["oracle-lfu"]["hits"] == 4);
  CHECK(j["policies"]["belady"]["hit_rate"].get<double>() == doctest::Approx(0.4));
  CHECK(j["policies"]["lru"]["of_belady"].get<double>() == doctest::Approx(0.5));  // 2 of MIN's 4 hits
  CHECK(j["policies"]["belady"]["of_belady"].get<double>() == doctest::Approx(1.0));
  CHECK(j["policies"]["adaptive"]["hits"].get<uint64_t>() >= j["policies"]["lru"]["hits"].get<uint64_t>());
  CHECK(j["policies"]["lru"]["per_layer"][0]["misses"] == 8);

  REQUIRE(run_command(sim() + " --trace " + trace.string() + " --capacity 3 --policy lru", &out) == 0);
  CHECK(out.find("hit rate 0.2000") != std::string::npos);
  CHECK(j["decode_protection"] == true);
}

TEST_CASE("xpack-sim --no-decode-protection: a prompt between decode runs then flushes decode's experts") {
  // Layer 0 decode uses 1, 2 (top-2); a 4-token prompt's groups (layers 0 and 1)
  // need 8 slots of 6; decode returns to 1, 2 (test_policy.cpp walks it by hand).
  TempDir dir;
  auto trace = dir / "t.csv";
  std::string csv = "step,layer,expert\n";
  for (int s = 0; s < 3; ++s) csv += std::to_string(s) + ",0,1\n" + std::to_string(s) + ",0,2\n";
  for (int l = 0; l < 2; ++l)
    for (int e = 3; e <= 6; ++e) csv += std::to_string(3 + l) + "," + std::to_string(l) + "," + std::to_string(e) + "\n";
  for (int s = 5; s < 7; ++s) csv += std::to_string(s) + ",0,1\n" + std::to_string(s) + ",0,2\n";
  write_file(trace, std::vector<uint8_t>(csv.begin(), csv.end()));
  std::string on, off;
  const std::string cmd = sim() + " --trace " + trace.string() + " --capacity 6 --policy lru --top-k 2 --json";
  REQUIRE(run_command(cmd, &on) == 0);
  REQUIRE(run_command(cmd + " --no-decode-protection", &off) == 0);
  auto jon = nlohmann::json::parse(on), joff = nlohmann::json::parse(off);
  CHECK(jon["decode_protection"] == true);
  CHECK(joff["decode_protection"] == false);
  CHECK(jon["policies"]["lru"]["hits"] == 8);
  CHECK(joff["policies"]["lru"]["hits"] == 6);
}

TEST_CASE("xpack-sim --host-capacity: a two-level replay, walked by hand") {
  TempDir dir;
  auto trace = dir / "t.csv";
  std::string csv = "step,layer,expert\n";
  int s = 0;
  for (int e : {1, 2, 3, 1, 4, 2, 5, 1, 2, 3}) csv += std::to_string(s++) + ",0," + std::to_string(e) + "\n";
  write_file(trace, std::vector<uint8_t>(csv.begin(), csv.end()));
  std::string out;
  // LRU, 2 slots, 3 frames (2 held): 3 demotes 1, 1 comes back (demoting 2),
  // 4 demotes 3, 2 back, 5 demotes 4 and drops 3, 1 back, 2 back, 3 is read
  // (dropping 4): 4 host hits, 6 reads, 8 demotions, 2 host evictions.
  REQUIRE(run_command(sim() + " --trace " + trace.string() + " --capacity 2 --host-capacity 3 --policy lru --json",
                      &out) == 0);
  auto j = nlohmann::json::parse(out);
  CHECK(j["host_capacity"] == 3);
  auto& p = j["policies"]["lru"];
  CHECK(p["hits"] == 0);
  CHECK(p["misses"] == 10);
  CHECK(p["host_hits"] == 4);
  CHECK(p["reads"] == 6);
  CHECK(p["host_demotions"] == 8);
  CHECK(p["host_evictions"] == 2);
  CHECK(p["hit_rate_with_host"].get<double>() == doctest::Approx(0.4));
  REQUIRE(run_command(sim() + " --trace " + trace.string() + " --capacity 2 --host-capacity 3 --policy lru", &out) == 0);
  CHECK(out.find("host hits 4, hit rate with host 0.4000, reads 6") != std::string::npos);
  // Without the flag nothing about a tier is printed; one frame is refused.
  REQUIRE(run_command(sim() + " --trace " + trace.string() + " --capacity 2 --policy lru --json", &out) == 0);
  CHECK_FALSE(nlohmann::json::parse(out)["policies"]["lru"].contains("host_hits"));
  CHECK(run_command(sim() + " --trace " + trace.string() + " --capacity 2 --host-capacity 1", &out) == 2);
  CHECK(out.find("holds nothing") != std::string::npos);
}

TEST_CASE("xpack-sim rejects bad arguments and bad traces") {
  TempDir dir;
  std::string out;
  CHECK(run_command(sim() + " --help", &out) == 0);
  CHECK(out.find("--capacity") != std::string::npos);
  CHECK(run_command(sim() + " --capacity 3", &out) != 0);
  auto bad = dir / "bad.csv";
  write_file(bad, {'x', '\n'});
  CHECK(run_command(sim() + " --trace " + bad.string() + " --capacity 3", &out) != 0);
  CHECK(run_command(sim() + " --trace " + bad.string() + " --capacity 0", &out) != 0);
  CHECK(run_command(sim() + " --trace " + bad.string() + " --capacity 3 --policy fifo", &out) != 0);
}

// The command-line conventions of tools/cli_app.h, as xpack-sim applies them.
namespace {
std::string sim_trace(const TempDir& dir) {
  auto trace = dir / "t.csv";
  std::string csv = "step,layer,expert\n0,0,1\n1,0,2\n2,0,1\n3,0,3\n";
  write_file(trace, std::vector<uint8_t>(csv.begin(), csv.end()));
  return trace.string();
}
int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }
}  // namespace

TEST_CASE("xpack-sim: --version, --help and --key=value") {
  std::string out;
  CHECK(run_command(sim() + " --version", &out) == 0);
  CHECK(out == std::string("xpack-sim ") + xpack_version() + "\n");
  CHECK(run_command(sim() + " --help", &out) == 0);
  for (const char* flag : {"--trace", "--capacity", "--policy", "--top-k", "--json", "--help", "--version"})
    CHECK_MESSAGE(out.find(flag) != std::string::npos, flag);
  CHECK(out.find("exit status") != std::string::npos);
  CHECK(out.find("SIZE") == std::string::npos);  // no size flags, no note about them

  TempDir dir;
  std::string t = sim_trace(dir), spaced, eq;
  REQUIRE(run_command(sim() + " --trace " + t + " --capacity 2 --policy lru --json", &spaced) == 0);
  REQUIRE(run_command(sim() + " --trace=" + t + " --capacity=2 --policy=lru --json", &eq) == 0);
  CHECK(eq == spaced);
  CHECK(nlohmann::json::parse(eq)["policies"]["lru"]["hits"] == 1);
  // A repeated flag takes its last value, as before CLI11.
  REQUIRE(run_command(sim() + " --trace " + t + " --capacity 1 --capacity=2 --policy lru --json", &out) == 0);
  CHECK(out == spaced);
}

TEST_CASE("xpack-sim: usage errors exit 2 with one line naming the flag") {
  TempDir dir;
  std::string t = sim_trace(dir), out;
  struct Case {
    std::string args, says;
  };
  const Case cases[] = {
      {"--trace " + t + " --capacity 3 --bogus", "unknown option --bogus"},
      {"--trace " + t + " --capacity 3 --bogus=1", "unknown option --bogus"},
      {"--trace " + t + " --capacity 3 extra", "unexpected argument 'extra'"},
      {"--trace " + t + " --capacity x", "--capacity: expected a whole number, got 'x'"},
      {"--trace " + t + " --capacity 1K",
       "--capacity: expected a whole number, got '1K' (a count takes no K/M/G/T suffix)"},
      {"--trace " + t + " --capacity -5", "--capacity"},
      {"--trace " + t + " --capacity 2.5", "--capacity: expected a whole number"},
      {"--trace " + t + " --capacity 0", "--capacity: 0 is out of range (>= 1)"},
      {"--trace " + t + " --capacity 99999999999999999999", "--capacity: 99999999999999999999 is out of range"},
      {"--trace " + t + " --capacity 3 --top-k 0", "--top-k: 0 is out of range (1..4294967295)"},
      {"--trace " + t + " --capacity 3 --top-k 4294967296", "--top-k: 4294967296 is out of range"},
      {"--trace " + t + " --capacity", "--capacity needs a value"},
      {"--trace " + t + " --capacity 3 --policy fifo", "--policy: unknown cache policy 'fifo'"},
      {"--capacity 3", "--trace is required"},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    CHECK(run_command(sim() + " " + c.args, &out) == 2);
    INFO(out);
    CHECK(out.find(c.says) != std::string::npos);
    CHECK(out.find("run with --help") != std::string::npos);
    CHECK(lines(out) == 1);
  }
  // A trace that cannot be read is a failure (1), not a usage error.
  auto bad = dir / "bad.csv";
  write_file(bad, {'x', '\n'});
  CHECK(run_command(sim() + " --trace " + bad.string() + " --capacity 3", &out) == 1);
}
