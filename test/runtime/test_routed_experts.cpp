// The routed-experts dispatcher (routed_experts.h) over a scripted expert
// source on the CPU backend: the weighted sum against a double reference, the
// result independent of which experts were resident (bit for bit), every
// requested expert got and released exactly once, resident ones first, gate and
// up in one product or two by the group's size with the same bits, and a
// failure in the middle of a layer still gives the request back.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cpu_backend.h"
#include "routed_experts.h"
#include "xpack/xpack.h"

using namespace xrun;

namespace {

constexpr int64_t kIn = 16, kFf = 8, kOut = 16;
constexpr int kExperts = 6;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct HostExpert {
  std::vector<float> gate, up, down;  // [kFf][kIn], [kFf][kIn], [kOut][kFf]
};

// What the dispatcher did with one request, in call order.
struct Log {
  std::vector<int> acquired;          // expert ids, as requested
  std::vector<int> got, released;     // request indices
  int requests_destroyed = 0;
};

class ScriptedSource final : public ExpertSource {
 public:
  // waits: what its requests say of waits_for_released().
  ScriptedSource(CpuBackend& be, std::set<int> resident, Log& log, bool waits = true)
      : resident_(std::move(resident)), log_(log), waits_(waits) {
    for (int e = 0; e < kExperts; ++e) {
      host_.push_back({random_floats(kFf * kIn, 100 + e), random_floats(kFf * kIn, 200 + e),
                       random_floats(kOut * kFf, 300 + e)});
      ExpertWeights w;
      w.expert = e;
      w.roles = {{"gate", be.upload(XPACK_TYPE_F32, host_[e].gate.data(), kIn, kFf)},
                 {"up", be.upload(XPACK_TYPE_F32, host_[e].up.data(), kIn, kFf)},
                 {"down", be.upload(XPACK_TYPE_F32, host_[e].down.data(), kFf, kOut)}};
      weights_.push_back(std::move(w));
    }
  }
  bool has_layer(int layer) const override { return layer == 0; }
  int n_experts() const override { return kExperts; }
  std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n, void*) override {
    REQUIRE(layer == 0);
    std::vector<int> ids(experts, experts + n);
    for (int e : ids) log_.acquired.push_back(e);
    return std::make_unique<Request>(*this, std::move(ids));
  }
  const HostExpert& host(int e) const { return host_[size_t(e)]; }

 private:
  struct Request final : ExpertRequest {
    Request(ScriptedSource& s, std::vector<int> ids) : src(s), ids(std::move(ids)), held(this->ids.size(), true) {}
    ~Request() override { ++src.log_.requests_destroyed; }
    bool resident(int i) const override { return src.resident_.count(ids.at(size_t(i))) != 0; }
    ExpertReady get(int i) override {
      REQUIRE(held.at(size_t(i)));
      src.log_.got.push_back(i);
      return {&src.weights_[size_t(ids[size_t(i)])], nullptr};
    }
    void release(int i) override {
      REQUIRE(held.at(size_t(i)));  // never twice
      held[size_t(i)] = false;
      src.log_.released.push_back(i);
    }
    bool waits_for_released() const override { return src.waits_; }
    ScriptedSource& src;
    std::vector<int> ids;
    std::vector<bool> held;
  };
  std::set<int> resident_;
  Log& log_;
  bool waits_;
  std::vector<HostExpert> host_;
  std::vector<ExpertWeights> weights_;
};

struct Batch {
  int64_t n = 0, k = 0;
  std::vector<float> x;        // [n][kIn]
  std::vector<int32_t> ids;    // [n][k]
  std::vector<float> weights;  // [n][k]
};

Batch make_batch() {
  Batch b;
  b.n = 4;
  b.k = 3;
  b.x = random_floats(size_t(b.n * kIn), 7);
  // Expert 2 is picked by every token, 5 by one, 1 never; ranks vary per token.
  b.ids = {2, 0, 5, 3, 2, 4, 2, 3, 0, 4, 0, 2};
  b.weights = {0.5f, 0.3f, 0.2f, 0.6f, 0.25f, 0.15f, 0.4f, 0.4f, 0.2f, 0.7f, 0.2f, 0.1f};
  return b;
}

ExpertFfn silu_ffn(CpuBackend& be) {
  return {[](const ExpertWeights& w) { return expert_matrices(w, kIn, kFf, kOut, "expert " + std::to_string(w.expert)); },
          [&be](const Tensor& g, const Tensor& u) { be.swiglu(g, u, 0.0f, g); }};
}

std::vector<float> run(CpuBackend& be, ScriptedSource& src, const Batch& b, const ExpertFfn& ffn, bool accumulate,
                       const std::vector<float>& start) {
  const Tensor x = be.upload(XPACK_TYPE_F32, b.x.data(), kIn, b.n);
  const Routing r{be.upload(XPACK_TYPE_I32, b.ids.data(), b.k, b.n),
                  be.upload(XPACK_TYPE_F32, b.weights.data(), b.k, b.n)};
  const Tensor out = be.upload(XPACK_TYPE_F32, start.data(), kOut, b.n);
  run_routed_experts(be, src, 0, x, r, ffn, accumulate, out);
  std::vector<float> y(size_t(b.n * kOut));
  be.download(out, y.data());
  return y;
}

// sum_j w[t][j] * down . (silu(gate . x) * (up . x)), in double.
std::vector<double> reference(const ScriptedSource& src, const Batch& b) {
  std::vector<double> y(size_t(b.n * kOut), 0.0);
  for (int64_t t = 0; t < b.n; ++t)
    for (int64_t j = 0; j < b.k; ++j) {
      const HostExpert& e = src.host(b.ids[size_t(t * b.k + j)]);
      std::vector<double> h(kFf);
      for (int64_t f = 0; f < kFf; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < kIn; ++i) {
          g += double(e.gate[size_t(f * kIn + i)]) * b.x[size_t(t * kIn + i)];
          u += double(e.up[size_t(f * kIn + i)]) * b.x[size_t(t * kIn + i)];
        }
        h[size_t(f)] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < kOut; ++o) {
        double s = 0;
        for (int64_t f = 0; f < kFf; ++f) s += double(e.down[size_t(o * kFf + f)]) * h[size_t(f)];
        y[size_t(t * kOut + o)] += double(b.weights[size_t(t * b.k + j)]) * s;
      }
    }
  return y;
}

}  // namespace

TEST_CASE("routed experts: the weighted sum of every pick, whichever experts are resident, bit for bit") {
  CpuBackend be(2);
  const Batch b = make_batch();
  const std::vector<float> zeros(size_t(b.n * kOut), 0.0f);
  const std::vector<std::set<int>> patterns = {{}, {0, 2, 3, 4, 5}, {2}, {0, 5}, {3, 4}};
  std::vector<float> first;
  for (const auto& resident : patterns) {
    Log log;
    ScriptedSource src(be, resident, log);
    const std::vector<float> y = run(be, src, b, silu_ffn(be), false, zeros);
    CAPTURE(resident.size());
    // The layer's distinct experts, ascending, in one request.
    CHECK(log.acquired == std::vector<int>{0, 2, 3, 4, 5});
    // Each got once and released once; the resident ones first.
    std::vector<int> got = log.got, released = log.released;
    std::sort(got.begin(), got.end());
    std::sort(released.begin(), released.end());
    CHECK(got == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(released == std::vector<int>{0, 1, 2, 3, 4});
    size_t n_resident = 0;
    for (int e : log.acquired) n_resident += resident.count(e);
    for (size_t i = 0; i < log.got.size(); ++i)
      CHECK((i < n_resident) == (resident.count(log.acquired[size_t(log.got[i])]) != 0));
    CHECK(log.requests_destroyed == 1);

    const std::vector<double> want = reference(src, b);
    for (size_t i = 0; i < y.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(double(y[i]) - want[i]) <= 1e-5 * (1.0 + std::abs(want[i])));
    }
    if (first.empty()) first = y;
    CHECK(y == first);  // bit for bit
  }
}

// A request none of whose experts waits for another's memory is released whole
// at its end, not expert by expert: the same result, no per-expert release.
TEST_CASE("routed experts: no release one by one where no expert waits for another's memory") {
  CpuBackend be(2);
  const Batch b = make_batch();
  const std::vector<float> zeros(size_t(b.n * kOut), 0.0f);
  for (const std::set<int>& resident : {std::set<int>{}, std::set<int>{0, 2, 3, 4, 5}, std::set<int>{2, 4}}) {
    CAPTURE(resident.size());
    Log waits_log, whole_log;
    ScriptedSource waits(be, resident, waits_log, true), whole(be, resident, whole_log, false);
    const std::vector<float> a = run(be, waits, b, silu_ffn(be), false, zeros);
    const std::vector<float> c = run(be, whole, b, silu_ffn(be), false, zeros);
    CHECK(a == c);
    CHECK(waits_log.released.size() == 5);
    CHECK(whole_log.released.empty());
    CHECK(whole_log.got.size() == 5);
    CHECK(whole_log.requests_destroyed == 1);
  }
}

// A group of more than 64 rows (a prompt's resident experts) runs gate and up as
// two grouped products; a decode-sized group (each missed expert alone here) as
// one over its rows gathered twice. Either way each row is its own product.
TEST_CASE("routed experts: a prompt-sized group and decode-sized groups give the same bits") {
  CpuBackend be(2);
  Batch b;
  b.n = 40;
  b.k = 3;
  b.x = random_floats(size_t(b.n * kIn), 17);
  std::mt19937 rng(5);
  for (int64_t t = 0; t < b.n; ++t) {
    std::vector<int32_t> e = {0, 1, 2, 3, 4, 5};
    std::shuffle(e.begin(), e.end(), rng);
    for (int64_t j = 0; j < b.k; ++j) {
      b.ids.push_back(e[size_t(j)]);
      b.weights.push_back(0.2f + 0.1f * float(j));
    }
  }
  const std::vector<float> zeros(size_t(b.n * kOut), 0.0f);
  std::vector<float> first;
  for (const std::set<int>& resident : {std::set<int>{0, 1, 2, 3, 4, 5}, std::set<int>{}, std::set<int>{1, 4}}) {
    CAPTURE(resident.size());
    Log log;
    ScriptedSource src(be, resident, log);
    const std::vector<float> y = run(be, src, b, silu_ffn(be), false, zeros);
    const std::vector<double> want = reference(src, b);
    for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(double(y[i]) - want[i]) <= 1e-5 * (1.0 + std::abs(want[i])));
    if (first.empty()) first = y;
    CHECK(y == first);
  }
}

TEST_CASE("routed experts: accumulate adds the routed sum onto what out holds") {
  CpuBackend be(1);
  const Batch b = make_batch();
  Log log;
  ScriptedSource src(be, {2}, log);
  const std::vector<float> zeros(size_t(b.n * kOut), 0.0f);
  const std::vector<float> base = random_floats(size_t(b.n * kOut), 11);
  const std::vector<float> plain = run(be, src, b, silu_ffn(be), false, zeros);
  const std::vector<float> acc = run(be, src, b, silu_ffn(be), true, base);
  for (size_t i = 0; i < acc.size(); ++i) CHECK(acc[i] == doctest::Approx(base[i] + plain[i]).epsilon(1e-6));
}

TEST_CASE("routed experts: a failing expert ends the layer with an error and the request given back") {
  CpuBackend be(1);
  const Batch b = make_batch();
  Log log;
  ScriptedSource src(be, {}, log);
  ExpertFfn ffn = silu_ffn(be);
  auto inner = ffn.matrices;
  ffn.matrices = [inner](const ExpertWeights& w) {
    if (w.expert == 4) throw ModelError("expert 4 is damaged");
    return inner(w);
  };
  const std::vector<float> zeros(size_t(b.n * kOut), 0.0f);
  CHECK_THROWS_WITH_AS(run(be, src, b, ffn, false, zeros), "expert 4 is damaged", ModelError);
  CHECK(log.requests_destroyed == 1);
  // A misshapen expert is named.
  Log log2;
  ScriptedSource src2(be, {}, log2);
  ExpertFfn wrong = silu_ffn(be);
  wrong.matrices = [](const ExpertWeights& w) { return expert_matrices(w, kIn, kFf + 1, kOut, "expert " + std::to_string(w.expert)); };
  CHECK_THROWS_AS(run(be, src2, b, wrong, false, zeros), ModelError);
  CHECK(log2.requests_destroyed == 1);
}

TEST_CASE("routed experts: routing that disagrees with the batch is refused before any expert is requested") {
  CpuBackend be(1);
  Batch b = make_batch();
  Log log;
  ScriptedSource src(be, {}, log);
  const Tensor x = be.upload(XPACK_TYPE_F32, b.x.data(), kIn, b.n);
  const Routing r{be.upload(XPACK_TYPE_I32, b.ids.data(), b.k, b.n - 1),
                  be.upload(XPACK_TYPE_F32, b.weights.data(), b.k, b.n - 1)};
  const Tensor out = be.alloc(XPACK_TYPE_F32, kOut, b.n);
  CHECK_THROWS_AS(run_routed_experts(be, src, 0, x, r, silu_ffn(be), false, out), ModelError);
  CHECK(log.acquired.empty());
}

TEST_CASE("routed experts: ids the host already knows are used without the device's (hash routing)") {
  CpuBackend be(1);
  const Batch b = make_batch();
  const std::vector<float> zeros(size_t(b.n * kOut), 0.0f);
  Log log;
  ScriptedSource src(be, {2, 3}, log);
  const std::vector<float> expected = run(be, src, b, silu_ffn(be), false, zeros);

  // The device's ids all name expert 1, which no token picks: the result and the
  // request can only come from the host's.
  Log log2;
  ScriptedSource src2(be, {2, 3}, log2);
  const std::vector<int32_t> wrong(b.ids.size(), 1);
  const Tensor x = be.upload(XPACK_TYPE_F32, b.x.data(), kIn, b.n);
  Routing r{be.upload(XPACK_TYPE_I32, wrong.data(), b.k, b.n), be.upload(XPACK_TYPE_F32, b.weights.data(), b.k, b.n)};
  r.host_ids = b.ids;
  const Tensor out = be.alloc(XPACK_TYPE_F32, kOut, b.n);
  run_routed_experts(be, src2, 0, x, r, silu_ffn(be), false, out);
  std::vector<float> y(size_t(b.n * kOut));
  be.download(out, y.data());
  CHECK(y == expected);
  CHECK(std::find(log2.acquired.begin(), log2.acquired.end(), 1) == log2.acquired.end());
  CHECK(log2.acquired == log.acquired);

  // Host ids of another batch size are refused before any expert is requested.
  Log log3;
  ScriptedSource src3(be, {}, log3);
  r.host_ids.pop_back();
  CHECK_THROWS_AS(run_routed_experts(be, src3, 0, x, r, silu_ffn(be), false, out), ModelError);
  CHECK(log3.acquired.empty());
}
