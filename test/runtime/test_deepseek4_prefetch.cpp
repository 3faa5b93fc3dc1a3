// deepseek4's hash-layer prefetch (models/deepseek4/moe.cpp over
// ExpertSource::prefetch, experts_cache.cpp): the layers that route by token id
// hand their experts to the expert cache as soon as a step's tokens are known.
//
// The deepseek4 oracle models (../shared/oracle) run from an Expert Pack; the
// experts the hash tables give for the fed tokens are worked out here from the
// model file's ffn_gate_tid2eid tensors (read through the C API, not through
// xpack-run's reader), and the cache's prefetch counters must equal them: with
// a cache that holds every expert, each distinct (hash layer, expert) pair is
// prefetched once, when first seen, and used by its layer; with a cache smaller
// than one layer's experts, a prefill prefetches as many as the empty cache has
// slots. The logits are bit-identical with --no-hash-prefetch. The seam itself
// (ids and layers out of range refused, the option honoured, hints to the
// direct reader only checked) is driven in-process.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "experts_factory.h"
#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"
#include "xpack/xpack.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

std::optional<fs::path> oracle_dir() { return oracle_dir_with("deepseek4-f32.gguf"); }

// The token -> experts table of each hash-routed layer, straight from the GGUF.
struct HashTable {
  int layer = 0;
  int64_t k = 0, n_vocab = 0;
  std::vector<int32_t> ids;  // [n_vocab][k]
};

std::vector<HashTable> read_hash_tables(const fs::path& gguf) {
  xpack_gguf* g = nullptr;
  REQUIRE_MESSAGE(xpack_gguf_open(gguf.c_str(), nullptr, &g) == 0, xpack_last_error());
  std::vector<HashTable> tables;
  const std::string suffix = ".ffn_gate_tid2eid.weight";
  for (int64_t i = 0; i < xpack_gguf_tensor_count(g); ++i) {
    xpack_tensor_info ti{};
    ti.size = sizeof ti;
    REQUIRE(xpack_gguf_tensor_info(g, i, &ti) == 0);
    const std::string name = ti.name;
    if (name.rfind("blk.", 0) != 0 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    REQUIRE(ti.type == XPACK_TYPE_I32);
    HashTable t;
    t.layer = std::stoi(name.substr(4));
    t.k = static_cast<int64_t>(ti.ne[0]);
    t.n_vocab = static_cast<int64_t>(ti.ne[1]);
    t.ids.resize(static_cast<size_t>(t.k * t.n_vocab));
    const void* data = nullptr;
    REQUIRE(xpack_gguf_tensor_data(g, i, &data) == 0);
    REQUIRE(ti.nbytes == t.ids.size() * sizeof(int32_t));
    std::memcpy(t.ids.data(), data, ti.nbytes);
    tables.push_back(std::move(t));
  }
  xpack_gguf_close(g);
  return tables;
}

// Distinct (hash layer, expert) pairs the tables give for these tokens.
size_t hash_pairs(const std::vector<HashTable>& tables, const std::vector<int32_t>& tokens) {
  std::set<std::pair<int, int32_t>> pairs;
  for (const HashTable& t : tables) {
    for (int32_t tok : tokens) {
      REQUIRE(tok >= 0);
      REQUIRE(tok < t.n_vocab);
      for (int64_t j = 0; j < t.k; ++j) pairs.insert({t.layer, t.ids[size_t(tok * t.k + j)]});
    }
  }
  return pairs.size();
}

struct Run {
  json out;                    // xpack-run --json
  std::vector<float> logits;  // every row
  uint64_t counter(const char* name) const { return out["counters"][name].get<uint64_t>(); }
  // The tokens the model was fed: the prompt, then every generated id (each is
  // fed back, the last one included).
  std::vector<int32_t> fed() const {
    std::vector<int32_t> v = out["prompt_ids"].get<std::vector<int32_t>>();
    for (int32_t t : out["gen_ids"].get<std::vector<int32_t>>()) v.push_back(t);
    return v;
  }
};

Run run_pack(const std::string& trunk_pack, const std::string& args, const fs::path& logits) {
  RunResult r = run(q(xpack_run_exe()) + " " + trunk_pack + " " + args + " --json --logits-out " + q(logits));
  INFO(args << "\n" << r.err);
  REQUIRE(r.rc == 0);
  Run out;
  out.out = json::parse(r.out);
  out.logits = read_f32(logits);
  REQUIRE(out.logits.size() == out.fed().size() * 512);  // the oracle vocabulary
  return out;
}

// Builds the pack of an oracle model; returns the -m/--pack arguments.
std::string build_pack(const fs::path& model, const fs::path& prefix) {
  RunResult b = run(q(xpack_build_exe()) + " " + q(model) + " -o " + q(prefix));
  INFO(b.out << b.err);
  REQUIRE(b.rc == 0);
  return "-m " + q(prefix.string() + ".trunk.gguf") + " --pack " + q(prefix.string() + ".xpack") + " -t 2";
}

struct OracleIds {
  std::vector<int32_t> prompt, gen;
};

OracleIds oracle_ids(const fs::path& oracle, const std::string& ref) {
  const json meta = read_json(oracle / "logits" / (ref + ".json"));
  return {meta["prompt_ids"].get<std::vector<int32_t>>(), meta["gen_ids"].get<std::vector<int32_t>>()};
}

std::string ids_arg(const std::vector<int32_t>& ids) { return "--prompt-ids " + join_ids(ids); }

}  // namespace

TEST_CASE("deepseek4: the hash layers' experts are prefetched exactly, and the logits do not change") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (deepseek4 models) not found");
    return;
  }
  xpack::test::TempDir tmp;
  int i = 0;
  for (const std::string file : {"deepseek4-f32.gguf", "deepseek4-mxfp4.gguf"}) {
    auto model = xpack::test::fixture_file(*oracle, "models/" + file);
    if (!model) continue;
    CAPTURE(file);
    const std::vector<HashTable> tables = read_hash_tables(*model);
    REQUIRE(!tables.empty());  // the oracle models have hash-routed layers (MANIFEST.md)
    const std::string pack = build_pack(*model, tmp / ("pack" + std::to_string(i++)));
    for (const std::string prompt : {"short", "long"}) {
      CAPTURE(prompt);
      const OracleIds o = oracle_ids(*oracle, "deepseek4-f32." + prompt);
      std::vector<int32_t> all = o.prompt;
      all.insert(all.end(), o.gen.begin(), o.gen.end());
      // Teacher-forced (one prefill of every id) and greedy decode (the prompt,
      // then one token per step); the whole runs touch every expert of the hash
      // layer, so short ones too, whose count grows step by step.
      const std::vector<int32_t> first3(all.begin(), all.begin() + 3), first1(all.begin(), all.begin() + 1);
      const std::pair<std::string, std::string> modes[] = {
          {"prefill", ids_arg(all) + " -n 0"},
          {"decode", ids_arg(o.prompt) + " -n " + std::to_string(o.gen.size()) + " --ignore-eos"},
          {"prefill", ids_arg(first3) + " -n 0"},
          {"decode", ids_arg(first1) + " -n 5 --ignore-eos"},
      };
      for (const auto& [mode, args] : modes) {
        CAPTURE(mode);
        // 4 MiB holds every expert of the model: nothing is evicted, so a pair
        // is resident from its first step on and prefetched exactly then.
        const Run on = run_pack(pack, args + " --cache-mib 4", tmp / "on.f32");
        const Run off = run_pack(pack, args + " --cache-mib 4 --no-hash-prefetch", tmp / "off.f32");
        REQUIRE(on.counter("cache_evictions") == 0);
        REQUIRE(off.counter("cache_evictions") == 0);
        REQUIRE(on.fed() == off.fed());
        const size_t want = hash_pairs(tables, on.fed());
        MESSAGE(file << " " << prompt << " " << mode << ": " << on.fed().size() << " tokens, " << want
                     << " hash (layer, expert) pairs, prefetch_issued " << on.counter("prefetch_issued"));
        CHECK(want > 0);
        CHECK(on.counter("prefetch_issued") == want);
        CHECK(on.counter("prefetch_used") == want);
        CHECK(on.counter("prefetch_wasted") == 0);
        CHECK(off.counter("prefetch_issued") == 0);
        // The prefetched experts are the hash layers' misses turned into hits;
        // every object is still read once.
        CHECK(on.counter("cache_misses") + want == off.counter("cache_misses"));
        CHECK(on.counter("cache_hits") == off.counter("cache_hits") + want);
        CHECK(on.counter("pack_reads") == off.counter("pack_reads"));
        CHECK(on.logits == off.logits);

        // Room for a few experts only (fewer than one layer's 16): experts are
        // evicted and read again. A prefill starts on an empty cache, so it
        // prefetches as many pairs as exact hints may hold: half the slots (the
        // other half is demand's, xpack_cache_prefetch_ex); in decode the count
        // depends on what the policy kept, and only its bounds are known.
        const uint64_t object = on.counter("object_bytes"), top_k = on.counter("n_experts_used");
        const uint64_t small_bytes = (top_k + 2) * ((object + 4095) / 4096 * 4096);
        const std::string small = " --cache-mib " + std::to_string(double(small_bytes) / 1048576.0);
        const Run s_on = run_pack(pack, args + small, tmp / "s_on.f32");
        const Run s_off = run_pack(pack, args + small + " --no-hash-prefetch", tmp / "s_off.f32");
        const uint64_t slots = s_on.counter("budget_objects");
        CAPTURE(slots);
        REQUIRE(slots >= top_k);
        REQUIRE(s_on.counter("cache_evictions") > 0);
        if (mode == "prefill") {
          CHECK(s_on.counter("prefetch_issued") == std::min<uint64_t>(want, slots / 2));
        } else {
          // The prompt's step as above; each later step at most its token's pairs.
          // This run's own prompt (the whole one, or its first token).
          const std::vector<int32_t> fed = s_on.fed();
          const std::vector<int32_t> prompt = s_on.out["prompt_ids"].get<std::vector<int32_t>>();
          size_t at_most = hash_pairs(tables, prompt);
          for (size_t t = prompt.size(); t < fed.size(); ++t) at_most += hash_pairs(tables, {fed[t]});
          CAPTURE(at_most);
          CHECK(s_on.counter("prefetch_issued") >= std::min<uint64_t>(hash_pairs(tables, prompt), slots / 2));
          CHECK(s_on.counter("prefetch_issued") <= at_most);
        }
        CHECK(s_on.counter("prefetch_used") <= s_on.counter("prefetch_issued"));
        MESSAGE("  with " << slots << " slots: prefetch_issued " << s_on.counter("prefetch_issued") << ", used "
                          << s_on.counter("prefetch_used") << ", wasted " << s_on.counter("prefetch_wasted"));
        CHECK(s_off.counter("prefetch_issued") == 0);
        CHECK(s_on.logits == s_off.logits);
        CHECK(s_on.logits == on.logits);
      }
    }
  }
}

TEST_CASE("ExpertSource::prefetch: the cache starts the hinted reads once; bad hints are refused") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (deepseek4 models) not found");
    return;
  }
  auto model = xpack::test::fixture_file(*oracle, "models/deepseek4-f32.gguf");
  if (!model) return;
  xpack::test::TempDir tmp;
  build_pack(*model, tmp / "p");
  xrun::PackSourceOptions po;
  po.pack_path = (tmp / "p.xpack").string();
  po.trunk_path = (tmp / "p.trunk.gguf").string();
  po.budget_bytes = 4u << 20;
  po.allow_buffered_io = true;  // a TMPDIR on tmpfs: the reads are the same either way
  auto counter = [](const xrun::ExpertSource& s, const char* name) {
    return s.counters_json()[name].get<uint64_t>();
  };
  const int32_t ab[] = {3, 5}, abc[] = {3, 5, 7}, bad_id[] = {16}, negative[] = {-1};

  SUBCASE("the cache") {
    std::unique_ptr<xrun::CacheExpertSource> source = xrun::open_cache_experts(po, 16);
    CHECK_THROWS_WITH_AS(source->prefetch(0, ab, 2), doctest::Contains("before create_cache"), xrun::ModelError);
    REQUIRE(source->create_cache(nullptr, nullptr));
    source->prefetch(0, ab, 2);
    CHECK(counter(*source, "prefetch_issued") == 2);
    source->prefetch(0, ab, 2);  // resident (or loading) already: nothing to start
    CHECK(counter(*source, "prefetch_issued") == 2);
    source->prefetch(0, ab, 0);
    CHECK(counter(*source, "prefetch_issued") == 2);
    {
      std::unique_ptr<xrun::ExpertRequest> req = source->acquire(0, abc, 3, nullptr);
      for (int j = 0; j < 3; ++j) {
        CHECK(req->get(j).weights->expert == abc[j]);
        req->release(j);
      }
    }
    CHECK(counter(*source, "prefetch_used") == 2);
    CHECK(counter(*source, "cache_hits") == 2);
    CHECK(counter(*source, "cache_misses") == 1);
    CHECK_THROWS_WITH_AS(source->prefetch(0, bad_id, 1), doctest::Contains("expert id 16 out of range"),
                         xrun::ModelError);
    CHECK_THROWS_WITH_AS(source->prefetch(0, negative, 1), doctest::Contains("expert id -1 out of range"),
                         xrun::ModelError);
    CHECK_THROWS_WITH_AS(source->prefetch(99, ab, 2), doctest::Contains("layer 99"), xrun::ModelError);
    CHECK_THROWS_AS(source->prefetch(-1, ab, 2), xrun::ModelError);
    CHECK(counter(*source, "prefetch_issued") == 2);
  }
  SUBCASE("the direct reader reads on acquire: hints are checked only") {
    std::unique_ptr<xrun::ExpertSource> source = xrun::make_pack_experts(po, 16);
    source->prefetch(1, abc, 3);
    CHECK(counter(*source, "pack_read_bytes") == 0);
    CHECK_THROWS_AS(source->prefetch(1, negative, 1), xrun::ModelError);
    CHECK_THROWS_AS(source->prefetch(42, abc, 3), xrun::ModelError);
  }
}
