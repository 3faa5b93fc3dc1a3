// Next-layer prefetch (--prefetch-next, examples/xpack-run/next_layer_guess.h).
//
// In-process, on the CPU backend: the guess is the next router's top-N (its
// gating and bias included), a batch's guess is its tokens' rank-weighted
// votes, the guess reaches the source only after the layer's own acquire, and
// it is scored against what the guessed layer then routes to.
//
// End to end, on xpack-synth models (random weights) of each architecture
// that has a MoE graph (deepseek4, kimi-k3, the Mixtral form of llama), run
// from their Expert Pack through a small expert cache: the logits and the
// generated ids are bit-identical with and without guesses, for both guess
// states; the counters agree with the run (one guess per guessing layer and
// step, N experts each, used <= issued, used <= routed, recall 1 when every
// expert is guessed); the guesses reach the cache; too large an N is refused,
// and so is any N for a model without routed experts.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu_backend.h"
#include "fixtures.h"
#include "next_layer_guess.h"
#include "routed_experts.h"
#include "runtime_harness.h"
#include "skip.h"
#include "xpack/xpack.h"

using namespace xrun;
using namespace xrun_test;
using nlohmann::json;

namespace {

constexpr int64_t kD = 8;
constexpr int kExperts = 6;

// Records the order of acquires and prefetches; every expert's FFN is zero.
class RecordingSource final : public ExpertSource {
 public:
  explicit RecordingSource(CpuBackend& be) {
    const std::vector<float> zeros(kD * kD, 0.0f);
    for (int e = 0; e < kExperts; ++e) {
      ExpertWeights w;
      w.expert = e;
      w.roles = {{"gate", be.upload(XPACK_TYPE_F32, zeros.data(), kD, kD)},
                 {"up", be.upload(XPACK_TYPE_F32, zeros.data(), kD, kD)},
                 {"down", be.upload(XPACK_TYPE_F32, zeros.data(), kD, kD)}};
      weights_.push_back(std::move(w));
    }
  }
  bool has_layer(int layer) const override { return layer >= 0 && layer < 3; }
  int n_experts() const override { return kExperts; }
  std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n, void*) override {
    log.push_back("acquire " + std::to_string(layer) + ":" + list(experts, n));
    return std::make_unique<Request>(*this, std::vector<int32_t>(experts, experts + n));
  }
  void prefetch_guess(int layer, const int32_t* experts, int n) override {
    ExpertSource::prefetch_guess(layer, experts, n);
    log.push_back("prefetch " + std::to_string(layer) + ":" + list(experts, n));
  }
  std::vector<std::string> log;

 private:
  static std::string list(const int32_t* e, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(e[i]);
    return s;
  }
  struct Request final : ExpertRequest {
    Request(RecordingSource& s, std::vector<int32_t> ids) : src(s), ids(std::move(ids)) {}
    bool resident(int) const override { return true; }
    ExpertReady get(int i) override { return {&src.weights_[size_t(ids.at(size_t(i)))], nullptr}; }
    void release(int) override {}
    RecordingSource& src;
    std::vector<int32_t> ids;
  };
  std::vector<ExpertWeights> weights_;
};

ExpertFfn zero_ffn(CpuBackend& be) {
  return {[](const ExpertWeights& w) { return expert_matrices(w, kD, kD, kD, "expert " + std::to_string(w.expert)); },
          [&be](const Tensor& g, const Tensor& u) { be.swiglu(g, u, 0.0f, g); }};
}

// A routing of n tokens with these ids (weights 1/k) and room for a guess.
Routing routing_of(CpuBackend& be, const std::vector<int32_t>& ids, int64_t n, int64_t k, int64_t guess_width) {
  Routing r = make_routing(be, n, k, guess_width);
  std::copy(ids.begin(), ids.end(), r.ids.i32());
  std::fill(r.weights.f32(), r.weights.f32() + n * k, 1.0f / float(k));
  return r;
}

uint64_t counter(const json& c, const char* name) { return c.at(name).get<uint64_t>(); }

}  // namespace

TEST_CASE("next-layer guess: the next router's top-N, with its gating and bias") {
  CpuBackend be(1);
  // Router of 6 experts over 8 inputs, and two token states.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(size_t(kExperts * kD)), x(size_t(2 * kD));
  for (float& v : w) v = u(rng);
  for (float& v : x) v = u(rng);
  const std::vector<float> bias = {0.0f, 0.9f, -0.4f, 0.3f, 0.0f, 0.2f};
  GuessRouter g{1, be.upload(XPACK_TYPE_F32, w.data(), kD, kExperts), GuessRouter::Gating::sqrt_softplus,
                be.upload(XPACK_TYPE_F32, bias.data(), kExperts, 1)};
  NextLayerGuesser guesser(3);
  NextGuess next{&guesser, &g, be.upload(XPACK_TYPE_F32, x.data(), kD, 2)};
  Routing r = make_routing(be, 2, 2, guesser.per_layer());
  guesser.enqueue(be, next, r);
  CHECK(r.guess_layer == 1);
  for (int t = 0; t < 2; ++t) {
    // sqrt(softplus(w . x)) + bias, best first, in double.
    std::vector<std::pair<double, int>> s;
    for (int e = 0; e < kExperts; ++e) {
      double dot = 0;
      for (int i = 0; i < kD; ++i) dot += double(w[size_t(e * kD + i)]) * x[size_t(t * kD + i)];
      s.push_back({-(std::sqrt(std::log1p(std::exp(dot))) + bias[size_t(e)]), e});
    }
    std::sort(s.begin(), s.end());
    for (int j = 0; j < 3; ++j) CHECK(r.guess.i32()[t * 3 + j] == s[size_t(j)].second);
  }
  // Without a bias the gating is skipped: the order of the raw products.
  GuessRouter plain{1, g.gate_inp, GuessRouter::Gating::sqrt_softplus, {}};
  NextGuess next_plain{&guesser, &plain, next.state};
  Routing r2 = make_routing(be, 2, 2, guesser.per_layer());
  guesser.enqueue(be, next_plain, r2);
  for (int t = 0; t < 2; ++t) {
    std::vector<std::pair<double, int>> s;
    for (int e = 0; e < kExperts; ++e) {
      double dot = 0;
      for (int i = 0; i < kD; ++i) dot += double(w[size_t(e * kD + i)]) * x[size_t(t * kD + i)];
      s.push_back({-dot, e});
    }
    std::sort(s.begin(), s.end());
    for (int j = 0; j < 3; ++j) CHECK(r2.guess.i32()[t * 3 + j] == s[size_t(j)].second);
  }
  // A routing made without room for the guess is refused.
  Routing narrow = make_routing(be, 2, 2, 0);
  CHECK_THROWS_WITH_AS(guesser.enqueue(be, next, narrow), doctest::Contains("no room"), ModelError);
}

TEST_CASE("next-layer guess: handed over after the layer's own acquire, then scored by the guessed layer") {
  CpuBackend be(1);
  RecordingSource src(be);
  NextLayerGuesser guesser(2);
  const Tensor x = be.alloc(XPACK_TYPE_F32, kD, 4), out = be.alloc(XPACK_TYPE_F32, kD, 4);

  // Layer 0: 4 tokens of top-2; their guesses for layer 1 (best first):
  // expert 3 gets 2+2+1+1 votes, 1 gets 1+2, 4 gets 2, 5 gets 1.
  Routing r0 = routing_of(be, {0, 1, 0, 2, 1, 2, 0, 4}, 4, 2, 2);
  const std::vector<int32_t> guess = {3, 1, 3, 5, 1, 3, 4, 3};
  std::copy(guess.begin(), guess.end(), r0.guess.i32());
  r0.guess_layer = 1;
  run_routed_experts(be, src, 0, x, r0, zero_ffn(be), false, out, &guesser);
  REQUIRE(src.log.size() == 2);
  CHECK(src.log[0] == "acquire 0:0,1,2,4");
  CHECK(src.log[1] == "prefetch 1:1,3");  // ascending; the two best voted, never before the acquire
  json c = guesser.counters_json();
  CHECK(counter(c, "next_guess_layer_steps") == 1);
  CHECK(counter(c, "next_guess_issued") == 2);
  CHECK(counter(c, "next_guess_routed") == 0);  // not scored yet

  // Layer 1 routes to 3 of the guess, not 1; makes no guess of its own (the last layer).
  Routing r1 = routing_of(be, {3, 0, 3, 5, 0, 2, 3, 0}, 4, 2, 0);
  run_routed_experts(be, src, 1, x, r1, zero_ffn(be), false, out, &guesser);
  CHECK(src.log.back() == "acquire 1:0,2,3,5");
  c = guesser.counters_json();
  CHECK(counter(c, "next_guess_used") == 1);
  CHECK(counter(c, "next_guess_routed") == 4);
  CHECK(c.at("next_guess_accuracy").get<double>() == 0.5);
  CHECK(c.at("next_guess_recall").get<double>() == 0.25);

  // A decode token: its own top-N as is; a layer without a pending guess is not scored.
  const Tensor x1 = be.alloc(XPACK_TYPE_F32, kD, 1), out1 = be.alloc(XPACK_TYPE_F32, kD, 1);
  Routing d0 = routing_of(be, {5, 4}, 1, 2, 2);
  d0.guess.i32()[0] = 2;
  d0.guess.i32()[1] = 0;
  d0.guess_layer = 2;
  run_routed_experts(be, src, 1, x1, d0, zero_ffn(be), false, out1, &guesser);
  CHECK(src.log.back() == "prefetch 2:0,2");
  CHECK(counter(guesser.counters_json(), "next_guess_routed") == 4);
  Routing d1 = routing_of(be, {2, 0}, 1, 2, 0);
  run_routed_experts(be, src, 2, x1, d1, zero_ffn(be), false, out1, &guesser);
  c = guesser.counters_json();
  CHECK(counter(c, "next_guess_layer_steps") == 2);
  CHECK(counter(c, "next_guess_issued") == 4);
  CHECK(counter(c, "next_guess_used") == 3);
  CHECK(counter(c, "next_guess_routed") == 6);

  // A guess the source refuses (an id out of range) fails the layer.
  Routing bad = routing_of(be, {0, 1}, 1, 2, 2);
  bad.guess.i32()[0] = 0;
  bad.guess.i32()[1] = kExperts;
  bad.guess_layer = 1;
  CHECK_THROWS_WITH_AS(run_routed_experts(be, src, 0, x1, bad, zero_ffn(be), false, out1, &guesser),
                       doctest::Contains("out of range"), ModelError);
}

TEST_CASE("next-layer guess: bad widths are refused") {
  CHECK_THROWS_WITH_AS(NextLayerGuesser(0), doctest::Contains("need >= 1"), ModelError);
  NextLayerGuesser g(7);
  CHECK_NOTHROW(g.check_experts(7));
  CHECK_THROWS_WITH_AS(g.check_experts(6), doctest::Contains("--prefetch-next 7 is more than the model's 6 experts"),
                       ModelError);
}

namespace {

struct SynthModel {
  const char* name;
  std::vector<std::string> args;  // xpack-synth's
  int guess_layers;               // layers that guess the next one's experts
  int n_expert, top_k;
};

// Small enough for CI; each has at least two consecutive learned-router MoE layers.
const SynthModel kModels[] = {
    {"deepseek4",
     {"--arch", "deepseek4", "--layers", "4", "--hash-layers", "1", "--embd", "256", "--heads", "4", "--experts", "32",
      "--top-k", "4", "--ff", "64", "--vocab", "512", "--router-skew", "0.7"},
     3, 32, 4},  // blocks 0 (hash), 1, 2 guess 1, 2, 3
    {"kimi-k3",
     {"--arch", "kimi-k3", "--layers", "4", "--dense-layers", "1", "--embd", "256", "--heads", "4", "--experts", "32",
      "--top-k", "4", "--ff", "256", "--vocab", "512"},
     2, 32, 4},  // MoE blocks 1, 2 guess 2, 3
    {"mixtral",
     {"--arch", "mixtral", "--layers", "3", "--embd", "64", "--heads", "4", "--experts", "8", "--top-k", "2", "--ff",
      "64", "--vocab", "512"},
     2, 8, 2},
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += " " + a;
  return s;
}

struct Out {
  json j;
  std::vector<float> logits;
  const json& c() const { return j.at("counters"); }
};

Out run_ok(const std::string& args, const fs::path& logits) {
  RunResult r = run(q(xpack_run_exe()) + " " + args + " --json --logits-out " + q(logits));
  INFO(args << "\n" << r.err);
  REQUIRE(r.rc == 0);
  return {json::parse(r.out), read_f32(logits)};
}

}  // namespace

TEST_CASE("--prefetch-next: the same logits with and without guesses, streamed through a small cache") {
  xpack::test::TempDir tmp;
  for (const SynthModel& m : kModels) {
    const std::string name = m.name;
    CAPTURE(name);
    const fs::path gguf = tmp / (std::string(m.name) + ".gguf"), prefix = tmp / m.name;
    RunResult s = run(q(xpack_synth_exe()) + " -q" + join(m.args) + " -o " + q(gguf));
    INFO(s.err);
    REQUIRE(s.rc == 0);
    RunResult b = run(q(xpack_build_exe()) + " " + q(gguf) + " -o " + q(prefix));
    INFO(b.err);
    REQUIRE(b.rc == 0);
    const std::string pack = "-m " + q(prefix.string() + ".trunk.gguf") + " --pack " + q(prefix.string() + ".xpack") +
                             " -t 2 --allow-buffered-io";
    const int n_gen = 6;
    const std::string decode = " --prompt-ids 1,5,9,200,33 -n " + std::to_string(n_gen) + " --ignore-eos";
    // Every expert fits: the reference, and what the cache needs to be "small".
    const Out full = run_ok(pack + decode + " --cache-mib 64", tmp / "full.f32");
    const uint64_t object = counter(full.c(), "object_bytes");
    const std::string small =
        " --cache-mib " + std::to_string(double((m.top_k + 2) * ((object + 4095) / 4096 * 4096)) / 1048576.0);
    const Out off = run_ok(pack + decode + small, tmp / "off.f32");
    REQUIRE(counter(off.c(), "cache_evictions") > 0);  // streamed: experts are read again
    CHECK(!off.c().contains("next_guess_issued"));
    CHECK(off.logits == full.logits);
    const int evals = 1 + n_gen;  // the prompt, then each generated token fed back
    for (const std::string from : {"moe-input", "renormed"}) {
      for (int n : {1, 2, m.n_expert}) {
        CAPTURE(from);
        CAPTURE(n);
        const std::string guess = " --prefetch-next " + std::to_string(n) + " --prefetch-next-from " + from;
        const Out on = run_ok(pack + decode + small + guess, tmp / "on.f32");
        CHECK(on.logits == off.logits);
        CHECK(on.j["gen_ids"] == off.j["gen_ids"]);
        const json& c = on.c();
        CHECK(c.at("next_guess_per_layer") == n);
        CHECK(c.at("next_guess_state") == from);
        CHECK(counter(c, "next_guess_layer_steps") == uint64_t(m.guess_layers * evals));
        // Each token's top-N are distinct, so every guess has exactly N experts.
        CHECK(counter(c, "next_guess_issued") == uint64_t(n * m.guess_layers * evals));
        CHECK(counter(c, "next_guess_used") <= counter(c, "next_guess_issued"));
        CHECK(counter(c, "next_guess_used") <= counter(c, "next_guess_routed"));
        // Decode steps route top-k distinct experts; the prompt at most its 5 tokens' worth.
        CHECK(counter(c, "next_guess_routed") >= uint64_t(m.guess_layers * evals * m.top_k));
        CHECK(counter(c, "next_guess_routed") <= uint64_t(m.guess_layers * (n_gen + 5) * m.top_k));
        if (n == m.n_expert) CHECK(counter(c, "next_guess_used") == counter(c, "next_guess_routed"));
        // The same demand reaches the cache; only what was already loading differs.
        CHECK(counter(c, "acquires") == counter(off.c(), "acquires"));
        CHECK(counter(c, "cache_hits") + counter(c, "cache_misses") ==
              counter(off.c(), "cache_hits") + counter(off.c(), "cache_misses"));
        CHECK(counter(c, "prefetch_used") <= counter(c, "prefetch_issued"));
        MESSAGE(name << " --prefetch-next " << n << " from " << from << ": accuracy "
                       << c.at("next_guess_accuracy").get<double>() << ", recall "
                       << c.at("next_guess_recall").get<double>() << "; cache misses " << counter(c, "cache_misses")
                       << " (without guesses " << counter(off.c(), "cache_misses") << "), prefetch issued "
                       << counter(c, "prefetch_issued") << " used " << counter(c, "prefetch_used"));
      }
    }
    // Where every expert fits, the guesses alone (no hash hints) start loads in
    // the cache, and a load that was used turns a first miss into a hit.
    const Out big = run_ok(pack + decode + " --cache-mib 64 --no-hash-prefetch --prefetch-next 2", tmp / "big.f32");
    CHECK(big.logits == full.logits);
    CHECK(counter(big.c(), "cache_evictions") == 0);
    CHECK(counter(big.c(), "prefetch_issued") > 0);
    CHECK(counter(big.c(), "prefetch_used") <= counter(big.c(), "prefetch_issued"));
    const Out big_off = run_ok(pack + decode + " --cache-mib 64 --no-hash-prefetch", tmp / "big_off.f32");
    CHECK(counter(big_off.c(), "prefetch_issued") == 0);
    CHECK(counter(big.c(), "cache_misses") <= counter(big_off.c(), "cache_misses"));

    // The plain GGUF (experts in memory): guesses are made and counted all the same.
    const Out plain = run_ok("-m " + q(gguf) + " -t 2" + decode + " --prefetch-next 2", tmp / "plain.f32");
    CHECK(plain.logits == full.logits);
    CHECK(counter(plain.c(), "next_guess_issued") == uint64_t(2 * m.guess_layers * evals));

    // More guessed experts than the model has: refused before any token.
    const std::string too_many = std::to_string(m.n_expert + 1);
    RunResult bad = run(q(xpack_run_exe()) + " " + pack + decode + " --prefetch-next " + too_many);
    CHECK(bad.rc == 1);
    CHECK(bad.err.find("--prefetch-next " + too_many + " is more than the model's " + std::to_string(m.n_expert) +
                       " experts per layer") != std::string::npos);
  }
}

TEST_CASE("--prefetch-next on a model without routed experts is an error, not a silent no-op") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf (test/data or ../shared/models) not found");
    return;
  }
  RunResult r = run(q(xpack_run_exe()) + " -m " + q(*model) + " --prompt-ids 1,403 -n 1 --prefetch-next 2");
  CHECK(r.rc == 1);
  CHECK(r.err.find("--prefetch-next 2: this model has no routed experts to guess") != std::string::npos);
  RunResult ok = run(q(xpack_run_exe()) + " -m " + q(*model) + " --prompt-ids 1,403 -n 1 --json");
  CHECK(ok.rc == 0);
}

TEST_CASE("next-layer guess: a guess outside make_routing's block is refused before any expert is requested") {
  CpuBackend be(1);
  RecordingSource src(be);
  NextLayerGuesser guesser(2);
  const Tensor x = be.alloc(XPACK_TYPE_F32, kD, 1), out = be.alloc(XPACK_TYPE_F32, kD, 1);
  Routing r = routing_of(be, {0, 1}, 1, 2, 2);
  r.guess.i32()[0] = 3;
  r.guess.i32()[1] = 2;
  r.guess_layer = 1;
  Routing separate = r;
  separate.guess = be.alloc(XPACK_TYPE_I32, 2, 1);  // its own allocation: not in the one download
  separate.id_block = be.alloc(XPACK_TYPE_I32, 1, 4);
  CHECK_THROWS_WITH_AS(run_routed_experts(be, src, 0, x, separate, zero_ffn(be), false, out, &guesser),
                       doctest::Contains("not in make_routing's block"), ModelError);
  NextLayerGuesser wider(3);
  CHECK_THROWS_WITH_AS(run_routed_experts(be, src, 0, x, r, zero_ffn(be), false, out, &wider),
                       doctest::Contains("not in make_routing's block"), ModelError);
  CHECK(src.log.empty());
  run_routed_experts(be, src, 0, x, r, zero_ffn(be), false, out, &guesser);
  REQUIRE(src.log.size() == 2);
  CHECK(src.log[1] == "prefetch 1:2,3");
}
