// xpack-synth --router-skew: the Zipf fit, the bias calibration (checked by an
// independent simulation) and its limit, and what the flag writes: exp_probs_b =
// beta ln w over a per-layer permutation, skewed hash tables, every other tensor
// unchanged.
// That the skew survives a real run of the router is runtime_synth_skew's job.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fixtures.h"
#include "gguf/gguf_model.h"
#include "synth_skew.h"
#include "xpack/xpack.h"

using namespace xpack;
using namespace xpack::gguf;

namespace {

std::string synth() { return (test::build_dir() / "tools" / "xpack-synth").string(); }

int run_synth(const std::string& args, std::string* out = nullptr) {
  std::string output;
  int rc = test::run_command(synth() + " " + args, &output);
  if (out) *out = output;
  return rc;
}

// The beta xpack-synth prints: "router skew: Zipf exponent A, exp_probs_b = BETA x ln w".
double printed_beta(const std::string& out) {
  const auto at = out.find("exp_probs_b = ");
  REQUIRE(at != std::string::npos);
  return std::stod(out.substr(at + 14));
}

std::vector<float> floats(const Model& m, const std::string& name) {
  const TensorInfo* t = m.find_tensor(name);
  REQUIRE_MESSAGE(t, name);
  REQUIRE(t->type == XPACK_TYPE_F32);
  auto p = m.tensor_data(*t);
  REQUIRE(p.ok());
  std::vector<float> v(t->nbytes / 4);
  std::memcpy(v.data(), *p, t->nbytes);
  return v;
}

// The rank-ordered log weights -A ln(r + 1) scaled by beta, as exp_probs_b must hold them.
void check_bias(const std::vector<float>& bias, double exponent, double beta) {
  std::vector<float> sorted = bias;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  for (size_t r = 0; r < sorted.size(); ++r) {
    const double want = -beta * exponent * std::log(static_cast<double>(r) + 1.0);
    REQUIRE_MESSAGE(std::fabs(sorted[r] - want) <= 1e-5 * (1.0 + std::fabs(want)), "rank " << r);
  }
}

}  // namespace

TEST_CASE("router skew: the Zipf fit recovers the exponent of exact Zipf counts") {
  for (double a : {0.0, 0.5, 0.8, 1.2, 2.0}) {
    std::vector<uint64_t> counts(256);
    for (size_t r = 0; r < counts.size(); ++r)
      counts[r] = static_cast<uint64_t>(std::llround(1e9 * std::pow(static_cast<double>(r) + 1.0, -a)));
    CHECK(synth::fit_zipf_exponent(counts) == doctest::Approx(a).epsilon(0.002));
  }
  CHECK(synth::fit_zipf_exponent({}) == 0.0);
  CHECK(synth::fit_zipf_exponent({0, 0, 0}) == 0.0);
  CHECK(synth::fit_zipf_exponent({5}) == 0.0);
  // All on the first rank: the fit is pinned at its upper clamp, finite.
  CHECK(synth::fit_zipf_exponent({100, 0, 0, 0}) == doctest::Approx(8.0).epsilon(0.01));
}

TEST_CASE("router skew: zipf_weights is a per-layer permutation of (r + 1)^-A") {
  const auto w0 = synth::zipf_weights(1, 0, 64, 1.2), w1 = synth::zipf_weights(1, 1, 64, 1.2);
  CHECK(w0 == synth::zipf_weights(1, 0, 64, 1.2));  // deterministic
  CHECK(w0 != w1);                                   // layers rank their experts differently
  CHECK(w0 != synth::zipf_weights(2, 0, 64, 1.2));   // and so do seeds
  for (const auto& w : {w0, w1}) {
    std::vector<double> s = w;
    std::sort(s.begin(), s.end(), std::greater<double>());
    for (size_t r = 0; r < s.size(); ++r) CHECK(s[r] == doctest::Approx(std::pow(r + 1.0, -1.2)));
  }
  for (double x : synth::zipf_weights(1, 3, 16, 0.0)) CHECK(x == 1.0);
}

// The calibration's promise, checked with draws of its own: for router logits
// N(0, embd / 768) per expert and independent tokens, the routes of top-k(gate(z) +
// beta ln w) go to the expert of rank r in proportion to r^-A (fitted).
TEST_CASE("router skew: the calibrated bias gives the routes a Zipf(A) popularity") {
  struct Case {
    synth::Gating g;
    uint64_t embd;
    uint32_t experts, top_k;
    double a;
  };
  uint64_t s = 0xABCDEF12345ull;
  auto uniform = [&] { return static_cast<double>(synth::splitmix64(s) >> 11) * 0x1p-53; };
  for (const Case& c : {Case{synth::Gating::SqrtSoftplus, 256, 256, 6, 0.8}, Case{synth::Gating::SqrtSoftplus, 4096, 256, 6, 1.2},
                        Case{synth::Gating::Sigmoid, 7168, 128, 16, 1.0}, Case{synth::Gating::SqrtSoftplus, 64, 16, 4, 0.5}}) {
    CAPTURE(c.embd);
    CAPTURE(c.a);
    auto beta = synth::calibrate_bias_scale(c.g, c.embd, c.experts, c.top_k, c.a);
    REQUIRE(beta.ok());
    REQUIRE(*beta > 0.0);
    const double sigma = std::sqrt(static_cast<double>(c.embd) / 768.0);
    std::vector<uint64_t> counts(c.experts);
    std::vector<std::pair<double, uint32_t>> v(c.experts);
    for (int t = 0; t < 8000; ++t) {
      for (uint32_t r = 0; r < c.experts; ++r) {
        const double z = sigma * std::sqrt(-2.0 * std::log(1.0 - uniform())) * std::cos(6.283185307179586 * uniform());
        const double score = c.g == synth::Gating::Sigmoid ? 1.0 / (1.0 + std::exp(-z)) : std::sqrt(std::log1p(std::exp(z)));
        v[r] = {score - *beta * c.a * std::log(r + 1.0), r};
      }
      std::partial_sort(v.begin(), v.begin() + c.top_k, v.end(), std::greater<>());
      for (uint32_t j = 0; j < c.top_k; ++j) ++counts[v[j].second];
    }
    CHECK(synth::fit_zipf_exponent(counts) == doctest::Approx(c.a).epsilon(0.05));
  }
  auto zero = synth::calibrate_bias_scale(synth::Gating::SqrtSoftplus, 256, 64, 6, 0.0);
  REQUIRE(zero.ok());
  CHECK(*zero == 0.0);
  // Past what top-k allows (every token on the same k experts) no beta exists.
  const double limit = synth::max_route_exponent(256, 6);
  CHECK(limit == doctest::Approx(1.56).epsilon(0.01));
  auto over = synth::calibrate_bias_scale(synth::Gating::SqrtSoftplus, 256, 256, 6, limit);
  REQUIRE(!over.ok());
  CHECK(over.error().message.find("at most 1.56") != std::string::npos);
  CHECK(synth::calibrate_bias_scale(synth::Gating::SqrtSoftplus, 256, 256, 6, limit - 0.1).ok());
}

TEST_CASE("router skew: deepseek4 biases and hash tables, and nothing else changes") {
  test::TempDir dir;
  const std::string base = "-q --arch deepseek4 --layers 4 --experts 64 --top-k 6 --hash-layers 2 ";
  const auto plain = (dir / "p.gguf").string(), skew = (dir / "s.gguf").string(), flat = (dir / "f.gguf").string();
  REQUIRE(run_synth(base + "-o " + plain) == 0);
  std::string out;
  REQUIRE(run_synth("--arch deepseek4 --layers 4 --experts 64 --top-k 6 --hash-layers 2 --router-skew 1.2 -o " + skew,
                    &out) == 0);
  const double beta = printed_beta(out);
  CHECK(beta == doctest::Approx(*synth::calibrate_bias_scale(synth::Gating::SqrtSoftplus, 256, 64, 6, 1.2)).epsilon(1e-4));
  REQUIRE(run_synth(base + "--router-skew 0 -o " + flat) == 0);
  auto p = Model::open(plain), m = Model::open(skew), f = Model::open(flat);
  REQUIRE(p.ok());
  REQUIRE(m.ok());
  REQUIRE(f.ok());
  for (uint32_t b = 2; b < 4; ++b) {
    const std::string name = "blk." + std::to_string(b) + ".exp_probs_b.bias";
    const auto bias = floats(*m, name);
    check_bias(bias, 1.2, beta);
    for (float x : floats(*f, name)) CHECK(x == 0.0f);  // A = 0: no bias at all
    // The expert of rank r has the bias of rank r: the permutation is zipf_weights'.
    const auto w = synth::zipf_weights(1, b, 64, 1.2);
    for (size_t e = 0; e < w.size(); ++e) CHECK(bias[e] == doctest::Approx(beta * std::log(w[e])));
  }
  for (uint32_t b = 0; b < 2; ++b) {
    const TensorInfo* t = m->find_tensor("blk." + std::to_string(b) + ".ffn_gate_tid2eid.weight");
    REQUIRE(t);
    auto d = m->tensor_data(*t);
    REQUIRE(d.ok());
    const int32_t* ids = reinterpret_cast<const int32_t*>(*d);
    const uint64_t k = t->ne[0], rows = t->ne[1];
    std::vector<uint64_t> by_rank(64);
    std::vector<uint32_t> rank(64);
    const auto w = synth::zipf_weights(1, b, 64, 1.2);
    for (uint32_t e = 0; e < 64; ++e)
      rank[e] = static_cast<uint32_t>(std::llround(std::pow(w[e], -1.0 / 1.2))) - 1;  // w = (r + 1)^-A
    bool distinct = true, in_range = true;
    for (uint64_t r = 0; r < rows; ++r) {
      const int32_t* row = ids + r * k;
      for (uint64_t j = 0; j < k; ++j) {
        in_range = in_range && row[j] >= 0 && row[j] < 64;
        distinct = distinct && std::find(row, row + j, row[j]) == row + j;
        if (row[j] >= 0 && row[j] < 64) ++by_rank[rank[static_cast<size_t>(row[j])]];
      }
    }
    CHECK(in_range);
    CHECK(distinct);
    // The 6 best-ranked experts (10 %) hold far more than their uniform 10 % of the table.
    uint64_t top = 0;
    for (int r = 0; r < 6; ++r) top += by_rank[static_cast<size_t>(r)];
    CHECK(static_cast<double>(top) / static_cast<double>(rows * k) > 0.3);
    CHECK(by_rank[0] > by_rank[10]);
    CHECK(by_rank[10] > by_rank[60]);
  }
  // Every other tensor is the unskewed file's, byte for byte.
  for (const auto& t : p->tensors()) {
    if (t.name.find("exp_probs_b") != std::string::npos || t.name.find("tid2eid") != std::string::npos) continue;
    const TensorInfo* u = m->find_tensor(t.name);
    REQUIRE_MESSAGE(u, t.name);
    auto a = p->tensor_data(t), b = m->tensor_data(*u);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK_MESSAGE(std::memcmp(*a, *b, t.nbytes) == 0, t.name);
  }
}

TEST_CASE("router skew: kimi-k3 (sigmoid router, F32 file) gets the same bias model") {
  test::TempDir dir;
  const auto path = (dir / "k.gguf").string();
  std::string out;
  REQUIRE(run_synth("--preset oracle-kimi-k3 --f32 --router-skew 0.8 -o " + path, &out) == 0);
  const double beta = printed_beta(out);
  CHECK(beta == doctest::Approx(*synth::calibrate_bias_scale(synth::Gating::Sigmoid, 320, 8, 2, 0.8)).epsilon(1e-4));
  auto m = Model::open(path);
  REQUIRE(m.ok());
  for (uint32_t b = 1; b < 4; ++b) check_bias(floats(*m, "blk." + std::to_string(b) + ".exp_probs_b.bias"), 0.8, beta);
}

TEST_CASE("router skew: bad values and architectures are refused") {
  test::TempDir dir;
  const auto path = (dir / "x.gguf").string();
  for (const char* bad : {"-1", "nan", "inf", "4.5", "1x", "", "0x1p0"}) {
    std::string out;
    CHECK_MESSAGE(run_synth(std::string("--arch deepseek4 --router-skew '") + bad + "' -o " + path, &out) == 2, bad);
    CHECK(out.find("--router-skew") != std::string::npos);
  }
  std::string out;
  CHECK(run_synth("--arch mixtral --router-skew 1 -o " + path, &out) == 2);
  CHECK(out.find("mixtral has no router bias") != std::string::npos);
  CHECK(run_synth("--arch deepseek4 --experts 256 --top-k 6 --router-skew 1.6 -o " + path, &out) == 2);
  CHECK(out.find("reaches at most 1.56") != std::string::npos);
  CHECK(!std::filesystem::exists(path));
}
