// xpack-run --trace: the routing trace recorded through libxpack's expert cache
// while the deepseek4 oracle model (../shared/oracle) runs from an Expert Pack.
// The CSV is parsed here independently of lib/stats, its experts are compared
// with llama.cpp's own routing (route.json), and xpack-sim must replay it with
// the same request count the live cache saw.
#include <doctest/doctest.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

std::optional<fs::path> oracle_dir() { return oracle_dir_with("deepseek4-f32.gguf"); }

fs::path xpack_sim_exe() { return xpack::test::build_dir() / "tools" / "xpack-sim"; }

// The model's shape from the oracle's generator record, not from our reader.
struct Shape {
  int n_layer = 0, n_expert = 0, top_k = 0;
  std::vector<int> moe_layers;  // blocks with routed-expert tensors, ascending
};

Shape shape_of(const fs::path& oracle) {
  json g = read_json(oracle / "info" / "deepseek4-f32.gen.json");
  Shape s;
  s.n_layer = g["hparams"]["n_layer"].get<int>();
  s.n_expert = g["hparams"]["n_expert"].get<int>();
  s.top_k = g["hparams"]["n_expert_used"].get<int>();
  std::set<int> moe;
  for (const auto& t : g["tensors"]) {
    const std::string name = t["name"].get<std::string>();
    const std::string suffix = ".ffn_gate_exps.weight";
    if (name.rfind("blk.", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      moe.insert(std::stoi(name.substr(4)));
  }
  s.moe_layers.assign(moe.begin(), moe.end());
  return s;
}

struct Line {
  uint64_t step;
  int layer, expert;
};

bool parse_field(const std::string& f, uint64_t* out) {
  auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), *out);
  return !f.empty() && ec == std::errc() && p == f.data() + f.size();
}

// Every line must be exactly three decimal numbers; a bad line fails the test.
std::vector<Line> parse_trace(const fs::path& p, const Shape& s) {
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), "no trace written at " << p);
  std::string line;
  REQUIRE(std::getline(f, line));
  CHECK(line == "step,layer,expert");
  std::vector<Line> out;
  size_t no = 1;
  while (std::getline(f, line)) {
    ++no;
    std::stringstream ss(line);
    std::string a, b, c, extra;
    uint64_t v[3];
    const bool ok = std::getline(ss, a, ',') && std::getline(ss, b, ',') && std::getline(ss, c, ',') &&
                    !std::getline(ss, extra) && parse_field(a, &v[0]) && parse_field(b, &v[1]) &&
                    parse_field(c, &v[2]);
    REQUIRE_MESSAGE(ok, "trace line " << no << ": '" << line << "'");
    REQUIRE_MESSAGE(v[1] < uint64_t(s.n_layer), "trace line " << no << ": layer " << v[1]);
    REQUIRE_MESSAGE(v[2] < uint64_t(s.n_expert), "trace line " << no << ": expert " << v[2]);
    out.push_back({v[0], int(v[1]), int(v[2])});
  }
  return out;
}

// Consecutive lines of one (step, layer): one cache request.
struct Group {
  uint64_t step;
  int layer;
  std::vector<int> experts;  // in file order
};

std::vector<Group> groups_of(const std::vector<Line>& lines) {
  std::vector<Group> g;
  for (const Line& l : lines) {
    if (g.empty() || g.back().step != l.step || g.back().layer != l.layer) g.push_back({l.step, l.layer, {}});
    g.back().experts.push_back(l.expert);
  }
  return g;
}

std::set<int> as_set(const std::vector<int>& v) { return std::set<int>(v.begin(), v.end()); }

std::string build_pack(const fs::path& oracle, const fs::path& prefix) {
  RunResult b = run(q(xpack_build_exe()) + " " + q(oracle / "models" / "deepseek4-f32.gguf") + " -o " + q(prefix));
  INFO(b.out << b.err);
  REQUIRE(b.rc == 0);
  return "-m " + q(prefix.string() + ".trunk.gguf") + " --pack " + q(prefix.string() + ".xpack") + " -t 2";
}

json sim_json(const fs::path& trace, uint64_t capacity) {
  RunResult r = run(q(xpack_sim_exe()) + " --trace " + q(trace) + " --capacity " + std::to_string(capacity) +
                    " --policy adaptive,lru,lfu,hybrid,decay,belady --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  return json::parse(r.out);
}

}  // namespace

TEST_CASE("xpack-run --trace: steps, layers and experts as llama.cpp routes them; xpack-sim replays it") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (deepseek4-f32.gguf) not found");
    return;
  }
  const Shape s = shape_of(*oracle);
  REQUIRE(!s.moe_layers.empty());
  REQUIRE(s.top_k > 1);
  xpack::test::TempDir tmp;
  const std::string model = build_pack(*oracle, tmp / "ds4");
  const json ref = read_json(*oracle / "logits" / "deepseek4-f32.short.json");
  const json route = read_json(*oracle / "logits" / "deepseek4-f32.short.route.json");
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> ref_gen = ref["gen_ids"].get<std::vector<int32_t>>();
  const int n_prompt = static_cast<int>(prompt.size());
  const int n_gen = static_cast<int>(ref_gen.size());

  // 1 MiB holds 21 objects of 48 KiB: more than one layer's 16 experts (so the
  // prompt batch is one request per layer) and fewer than all 64 (so it evicts).
  // No hash-layer prefetch: the trace holds demand requests only, so xpack-sim's
  // replay below sees what the live cache saw.
  const fs::path trace = tmp / "trace.csv";
  RunResult r = run(q(xpack_run_exe()) + " " + model + " --prompt-ids " + join_ids(prompt) + " -n " +
                    std::to_string(n_gen) + " --ignore-eos --cache-mib 1 --json --no-hash-prefetch --trace " + q(trace));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const json out = json::parse(r.out);
  const std::vector<int32_t> gen = out["gen_ids"].get<std::vector<int32_t>>();
  REQUIRE(static_cast<int>(gen.size()) == n_gen);
  const json& counters = out["counters"];
  REQUIRE(counters["source"] == "pack-cache");
  const uint64_t capacity = counters["budget_objects"].get<uint64_t>();
  CHECK(capacity > uint64_t(s.n_expert));
  CHECK(capacity < uint64_t(s.n_expert) * s.moe_layers.size());

  const std::vector<Line> lines = parse_trace(trace, s);
  const std::vector<Group> groups = groups_of(lines);

  // Step 0 is the prompt batch, step i the i-th generated token fed back (the
  // last sampled token is fed back too: n_gen decode evaluations); every step
  // requests each MoE layer once, in layer order.
  REQUIRE(groups.size() == size_t(n_gen + 1) * s.moe_layers.size());
  size_t expected_lines = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    const uint64_t step = i / s.moe_layers.size();
    CAPTURE(step);
    CHECK(g.step == step);
    CHECK(g.layer == s.moe_layers[i % s.moe_layers.size()]);
    CHECK(as_set(g.experts).size() == g.experts.size());  // a request names each expert once
    if (step == 0) {
      // The prompt batch: the distinct experts its tokens route to, which is
      // what the cache is asked for (not n_prompt x top-k lines).
      CHECK(g.experts.size() >= size_t(s.top_k));
      CHECK(g.experts.size() <= size_t(std::min(n_prompt * s.top_k, s.n_expert)));
      expected_lines += g.experts.size();
    } else {
      CHECK(g.experts.size() == size_t(s.top_k));
      expected_lines += size_t(s.top_k);
    }
  }
  CHECK(lines.size() == expected_lines);

  // llama.cpp's routing of the same sequence (teacher-forced on its greedy ids,
  // which ours must equal; no routing margin in this prompt is below 2e-5).
  CHECK(gen == ref_gen);
  for (size_t i = 0; i < groups.size() && gen == ref_gen; ++i) {
    const Group& g = groups[i];
    const json& ids = route["moe"][std::to_string(g.layer)]["ids"];
    std::set<int> want;
    if (g.step == 0) {
      for (int p = 0; p < n_prompt; ++p)
        for (const auto& e : ids[p]) want.insert(e.get<int>());
    } else {
      for (const auto& e : ids[n_prompt + int(g.step) - 1]) want.insert(e.get<int>());
    }
    CAPTURE(g.step);
    CAPTURE(g.layer);
    CHECK(as_set(g.experts) == want);
  }

  // The live cache counts each expert of a request once, as a hit or a miss.
  CHECK(counters["cache_hits"].get<uint64_t>() + counters["cache_misses"].get<uint64_t>() == lines.size());

  // xpack-sim at the live capacity: every line is one request of one expert.
  const json sim = sim_json(trace, capacity);
  uint64_t belady_hits = sim["policies"]["belady"]["hits"].get<uint64_t>();
  for (const auto& [name, p] : sim["policies"].items()) {
    CAPTURE(name);
    CHECK(p["hits"].get<uint64_t>() + p["misses"].get<uint64_t>() == lines.size());
    CHECK(p["bypassed"].get<uint64_t>() == 0);
    CHECK(p["hits"].get<uint64_t>() <= belady_hits);
  }
  // Known difference (reported): the live acquire protects only the experts of
  // the request placed so far, xpack-sim the whole request, so the live cache
  // can evict an expert the same request needs next and count a second miss.
  const uint64_t live_hits = counters["cache_hits"].get<uint64_t>();
  // The live cache runs the default policy, adaptive.
  const uint64_t sim_default_hits = sim["policies"]["adaptive"]["hits"].get<uint64_t>();
  WARN_MESSAGE(live_hits == sim_default_hits, "live cache hits " << live_hits << " vs xpack-sim adaptive "
                                                                  << sim_default_hits << " at " << capacity << " slots");

  // With a slot for every (layer, expert) only first uses miss, for every policy.
  std::set<std::pair<int, int>> keys;
  for (const Line& l : lines) keys.insert({l.layer, l.expert});
  const json all = sim_json(trace, keys.size());
  for (const auto& [name, p] : all["policies"].items()) {
    CAPTURE(name);
    CHECK(p["misses"].get<uint64_t>() == keys.size());
  }
}

TEST_CASE("xpack-run --trace: a one-token prompt gives tokens x top-k x MoE layers lines") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (deepseek4-f32.gguf) not found");
    return;
  }
  const Shape s = shape_of(*oracle);
  xpack::test::TempDir tmp;
  const std::string model = build_pack(*oracle, tmp / "ds4");
  const fs::path trace = tmp / "one.csv";
  const int n_gen = 17;
  RunResult r = run(q(xpack_run_exe()) + " " + model + " --prompt-ids 1 -n " + std::to_string(n_gen) +
                    " --ignore-eos --cache-mib 0.25 --trace " + q(trace));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const std::vector<Line> lines = parse_trace(trace, s);
  // 1 prompt token + n_gen fed-back tokens, each one request of top-k per MoE layer.
  CHECK(lines.size() == size_t(1 + n_gen) * s.top_k * s.moe_layers.size());
  for (const Group& g : groups_of(lines)) CHECK(g.experts.size() == size_t(s.top_k));
  const json sim = sim_json(trace, 5);
  for (const auto& [name, p] : sim["policies"].items())
    CHECK(p["hits"].get<uint64_t>() + p["misses"].get<uint64_t>() == lines.size());
}

TEST_CASE("xpack-run --trace refuses readers that cannot record instead of writing nothing") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (deepseek4-f32.gguf) not found");
    return;
  }
  xpack::test::TempDir tmp;
  const std::string model = build_pack(*oracle, tmp / "ds4");
  const std::string plain = "-m " + q(*oracle / "models" / "deepseek4-f32.gguf");
  const std::string prompt = " --prompt-ids 1,403,407,261,378,432,383,286,261,376,400,428 -n 2";
  const fs::path trace = tmp / "t.csv";

  SUBCASE("plain GGUF without --pack") {
    RunResult r = run(q(xpack_run_exe()) + " " + plain + prompt + " --trace " + q(trace));
    CHECK(r.rc == 2);
    CHECK(r.err.find("--trace needs --pack") != std::string::npos);
    CHECK(!fs::exists(trace));
  }
  SUBCASE("direct reader") {
    RunResult r = run(q(xpack_run_exe()) + " " + model + prompt + " --expert-reader direct --trace " + q(trace));
    CHECK(r.rc == 2);
    CHECK(r.err.find("--expert-reader cache") != std::string::npos);
    CHECK(!fs::exists(trace));
  }
  SUBCASE("a budget below top-k: no silent fallback to the direct reader") {
    RunResult r = run(q(xpack_run_exe()) + " " + model + prompt + " --cache-mib 0.1 --trace " + q(trace));
    CHECK(r.rc == 1);
    CHECK(r.err.find("--trace: the expert cache is unavailable") != std::string::npos);
  }
  SUBCASE("a trace path that cannot be created") {
    RunResult r = run(q(xpack_run_exe()) + " " + model + prompt + " --trace " + q(tmp / "no" / "such" / "t.csv"));
    CHECK(r.rc == 1);
    CHECK(r.err.find("--trace") != std::string::npos);
    CHECK(r.err.find("t.csv") != std::string::npos);
  }
  SUBCASE("a prompt batch wider than the cache streams through it and keeps the trace intact") {
    // 0.5 MiB = 10 slots; twelve prompt tokens route to more distinct experts in
    // some layer: those experts wait for slots inside one request per layer.
    RunResult small = run(q(xpack_run_exe()) + " " + model + prompt + " --json --cache-mib 0.5 --trace " + q(trace));
    REQUIRE(small.rc == 0);
    const json js = json::parse(small.out);
    CHECK(js["counters"]["deferred_experts"].get<uint64_t>() > 0);
    const fs::path big_trace = tmp / "big.csv";
    RunResult big = run(q(xpack_run_exe()) + " " + model + prompt + " --cache-mib 4 --trace " + q(big_trace));
    REQUIRE(big.rc == 0);
    // Routing, and so the trace, does not depend on the cache size.
    CHECK(xpack::test::read_file(trace) == xpack::test::read_file(big_trace));
  }
  SUBCASE("a trace the disk cannot take is an error, not a silently short file") {
    // /dev/full accepts the open and fails every write with ENOSPC.
    RunResult r = run(q(xpack_run_exe()) + " " + model + prompt + " --trace /dev/full");
    CHECK(r.rc == 1);
    CHECK(r.err.find("routing trace could not be written") != std::string::npos);
  }
  SUBCASE("--trace without a value") {
    RunResult r = run(q(xpack_run_exe()) + " " + model + prompt + " --trace");
    CHECK(r.rc == 2);
    CHECK(r.err.find("missing value for --trace") != std::string::npos);
  }
}
