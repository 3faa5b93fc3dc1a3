// xpack-sim end to end: the tool built in this tree on a hand-computed trace.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "fixtures.h"

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
  CHECK(j["policies"]["belady"]["hit_rate"].get<double>() == doctest::Approx(0.4));
  CHECK(j["policies"]["lru"]["per_layer"][0]["misses"] == 8);

  REQUIRE(run_command(sim() + " --trace " + trace.string() + " --capacity 3 --policy lru", &out) == 0);
  CHECK(out.find("hit rate 0.2000") != std::string::npos);
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
