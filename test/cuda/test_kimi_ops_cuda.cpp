// kimi-k3's own operations (models/kimi_k3/kimi_ops.h) on CUDA against the CPU
// versions (themselves checked end to end against llama.cpp in
// test/runtime/test_kimi_k3.cpp): the same random inputs through make_kimi_ops
// of both backends, results within float rounding. Covers both KDA gate forms,
// short convolutions continuing their state across calls (also with fewer
// tokens than taps), the delta rule at the model's head_dim (its state over
// 48 KiB of shared memory) carried across calls, the chunked delta rule against
// the recurrent step (and a timing of both at Kimi-K3's dims), MLA on both of
// its paths (the one-kernel path under 16 query tokens, the batched prefill of
// cuBLAS products from 16 on, over two chunks of tokens and past the kernel's
// key limit) with a position offset, more keys than a block has threads and no
// rope part, and the CUDA kernels' limits refused with a message. Without a
// CUDA device every case is skipped (exit 77).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "delta_rule_inputs.h"
#include "gpu_available.h"
#include "kimi_kernels.h"
#include "models/kimi_k3/kimi_ops.h"
#include "models/kimi_k3/kimi_ops_cpu.h"
#include "skip.h"
#include "xpack/xpack.h"

using namespace xrun;
using xrun::kimi_k3::KimiOps;
using xrun::kimi_k3::set_cuda_mla_product_keys;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}
std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  return random_floats(n, seed, -scale, scale);
}

struct Both {
  Tensor cpu, gpu;
};

struct Fixture {
  CpuBackend cpu{2};
  CudaBackend gpu{0};
  std::unique_ptr<KimiOps> cpu_ops = kimi_k3::make_kimi_ops(cpu), gpu_ops = kimi_k3::make_kimi_ops(gpu);

  Both up(const std::vector<float>& v, int64_t width) {
    const int64_t rows = static_cast<int64_t>(v.size()) / width;
    return {cpu.upload(XPACK_TYPE_F32, v.data(), width, rows), gpu.upload(XPACK_TYPE_F32, v.data(), width, rows)};
  }
  Both alloc(int64_t width, int64_t rows) {
    return {cpu.alloc(XPACK_TYPE_F32, width, rows), gpu.alloc(XPACK_TYPE_F32, width, rows)};
  }
  // Worst |cpu - gpu| / (1 + |cpu|); every GPU value finite.
  double diff(const Both& t) {
    std::vector<float> a(static_cast<size_t>(t.cpu.numel())), b(static_cast<size_t>(t.gpu.numel()));
    cpu.download(t.cpu, a.data());
    gpu.download(t.gpu, b.data());
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE(std::isfinite(b[i]));
      worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / (1.0 + std::fabs(double(a[i]))));
    }
    return worst;
  }
  void same(const Both& t, double tol, const std::string& what) {
    const double d = diff(t);
    INFO(what << ": worst relative difference " << d);
    CHECK(d <= tol);
  }
};

// Float sums in the CPU's order with --fmad=false: what is left are expf/tanhf/
// logf's last-bit differences, grown by the few operations after them.
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("kimi ops on CUDA: make_kimi_ops gives the CUDA backend its kernels") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  REQUIRE(f.gpu_ops != nullptr);
  CHECK(dynamic_cast<kimi_k3::CpuKimiOps*>(f.cpu_ops.get()) != nullptr);
  CHECK(dynamic_cast<kimi_k3::CpuKimiOps*>(f.gpu_ops.get()) == nullptr);  // not the CPU code on device pointers
}

TEST_CASE("kimi ops on CUDA: situ, with and without the linear transform, equals the CPU") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t w = 300, n = 5;
  const auto gv = random_floats(size_t(w * n), 1, 12.0f), uv = random_floats(size_t(w * n), 2, 40.0f);
  for (float lb : {3.0f, 25.0f, 0.0f}) {
    CAPTURE(lb);
    const Both g = f.up(gv, w), u = f.up(uv, w);
    f.cpu_ops->situ(g.cpu, u.cpu, 2.0f, lb);
    f.gpu_ops->situ(g.gpu, u.gpu, 2.0f, lb);
    f.same(g, kTol, "situ");
  }
  const Both g = f.up(gv, w), u = f.up(uv, w);
  CHECK_THROWS_AS(f.gpu_ops->situ(g.gpu, u.gpu, 0.0f, 1.0f), ModelError);  // beta must be > 0
  const Both shorter = f.up(std::vector<float>(size_t(w), 1.0f), w);
  CHECK_THROWS_AS(f.gpu_ops->situ(g.gpu, shorter.gpu, 2.0f, 1.0f), ModelError);
}

TEST_CASE("kimi ops on CUDA: res_mix over 0, 1, 3 and 9 checkpoints equals the CPU") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t E = 320, n = 4;
  const Both cur = f.up(random_floats(size_t(E * n), 10, 3.0f), E);
  const Both w = f.up(random_floats(size_t(E), 11, 0.5f), E);
  for (int nc : {0, 1, 3, 9}) {
    CAPTURE(nc);
    std::vector<Both> ck;
    std::vector<Tensor> ck_cpu, ck_gpu;
    for (int c = 0; c < nc; ++c) {
      ck.push_back(f.up(random_floats(size_t(E * n), 20 + c, 1.0f + c), E));
      ck_cpu.push_back(ck.back().cpu);
      ck_gpu.push_back(ck.back().gpu);
    }
    const Both out = f.alloc(E, n);
    f.cpu_ops->res_mix(cur.cpu, ck_cpu, w.cpu, 1e-5f, out.cpu);
    f.gpu_ops->res_mix(cur.gpu, ck_gpu, w.gpu, 1e-5f, out.gpu);
    f.same(out, kTol, "res_mix");
  }
  // more checkpoints than the kernel's parameter holds: refused, naming the limit
  std::vector<Tensor> many(size_t(xpack::rt::kimi::kMaxCkpts + 1), cur.gpu);
  const Both out = f.alloc(E, n);
  try {
    f.gpu_ops->res_mix(cur.gpu, many, w.gpu, 1e-5f, out.gpu);
    FAIL("res_mix accepted too many checkpoints");
  } catch (const ModelError& e) {
    CHECK(std::string(e.what()).find("at most") != std::string::npos);
  }
}

TEST_CASE("kimi ops on CUDA: the short convolution continues its state across calls, as on the CPU") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t D = 130;
  for (int64_t d_conv : {4, 1, 2, xpack::rt::kimi::kMaxConv}) {
    CAPTURE(d_conv);
    const Both w = f.up(random_floats(size_t(D * d_conv), 30 + uint32_t(d_conv), 0.7f), d_conv);
    Both state = f.alloc(D, d_conv - 1);
    if (d_conv > 1) state = f.up(random_floats(size_t(D * (d_conv - 1)), 31, 2.0f), D);
    // 7 tokens, then 2 (fewer than the window when d_conv = 4: the state keeps
    // some of its old rows), then 1 (decode)
    uint32_t seed = 40;
    for (int64_t n : {7, 100, 2, 1}) {
      CAPTURE(n);
      const Both x = f.up(random_floats(size_t(D * n), seed++, 3.0f), D);
      f.cpu_ops->short_conv_silu(x.cpu, w.cpu, state.cpu);
      f.gpu_ops->short_conv_silu(x.gpu, w.gpu, state.gpu);
      f.same(x, kTol, "short_conv_silu output");
      if (d_conv > 1) f.same(state, 0.0, "short_conv_silu state (raw inputs, copied)");
    }
  }
  const int64_t too_long = xpack::rt::kimi::kMaxConv + 1;
  const Both w = f.up(random_floats(size_t(D * too_long), 50), too_long);
  const Both state = f.alloc(D, too_long - 1), x = f.up(random_floats(size_t(D), 51), D);
  CHECK_THROWS_AS(f.gpu_ops->short_conv_silu(x.gpu, w.gpu, state.gpu), ModelError);
  f.cpu_ops->short_conv_silu(x.cpu, w.cpu, state.cpu);  // the CPU has no such limit
  const Both bad_state = f.alloc(D, 2);
  const Both w4 = f.up(random_floats(size_t(D * 4), 52), 4);
  CHECK_THROWS_AS(f.gpu_ops->short_conv_silu(x.gpu, w4.gpu, bad_state.gpu), ModelError);
}

TEST_CASE("kimi ops on CUDA: the KDA gate (lower-bound sigmoid and softplus) equals the CPU") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t hd = 32, H = 4, D = hd * H, n = 3;
  // up to +-30: the softplus form switches to the identity above 20
  const auto gv = random_floats(size_t(D * n), 60, 30.0f);
  const Both dt = f.up(random_floats(size_t(D), 61, 2.0f), D);
  const Both a = f.up(random_floats(size_t(H), 62, -3.0f, -0.1f), H);  // -exp(A_log) < 0
  for (bool lower : {true, false}) {
    CAPTURE(lower);
    const Both g = f.up(gv, D);
    f.cpu_ops->kda_gate(g.cpu, dt.cpu, a.cpu, hd, lower, -5.0f);
    f.gpu_ops->kda_gate(g.gpu, dt.gpu, a.gpu, hd, lower, -5.0f);
    f.same(g, kTol, "kda_gate");
  }
  const Both g = f.up(gv, D);
  CHECK_THROWS_AS(f.gpu_ops->kda_gate(g.gpu, dt.gpu, a.gpu, 33, true, -5.0f), ModelError);
}

TEST_CASE("kimi ops on CUDA: the delta rule's outputs and state equal the CPU's, call after call") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  // 32: the oracle models; 128: Kimi-K3's (a 64 KiB state per head in shared memory); 48: not a warp multiple
  for (int64_t hd : {32, 128, 48}) {
    const int64_t H = 3, D = H * hd;
    CAPTURE(hd);
    Both state = f.alloc(hd * hd, H);
    uint32_t seed = 70 + uint32_t(hd);
    for (int64_t n : {9, 1, 1, 4}) {  // a prefill, two decode steps, another batch on the same state
      CAPTURE(n);
      auto unit = [&](uint32_t s) {  // l2-normed rows per head, as the graph feeds them
        auto v = random_floats(size_t(D * n), s);
        for (int64_t r = 0; r < n * H; ++r) {
          double ss = 0;
          for (int64_t i = 0; i < hd; ++i) ss += double(v[r * hd + i]) * v[r * hd + i];
          for (int64_t i = 0; i < hd; ++i) v[r * hd + i] = float(v[r * hd + i] / std::sqrt(ss));
        }
        return v;
      };
      const Both q = f.up(unit(seed++), D), k = f.up(unit(seed++), D);
      const Both v = f.up(random_floats(size_t(D * n), seed++, 2.0f), D);
      const Both g = f.up(random_floats(size_t(D * n), seed++, -1.5f, 0.0f), D);  // log decay <= 0
      const Both beta = f.up(random_floats(size_t(H * n), seed++, 0.0f, 1.0f), H);
      const Both o = f.alloc(D, n);
      f.cpu_ops->delta_rule(q.cpu, k.cpu, v.cpu, g.cpu, beta.cpu, state.cpu, o.cpu);
      f.gpu_ops->delta_rule(q.gpu, k.gpu, v.gpu, g.gpu, beta.gpu, state.gpu, o.gpu);
      f.same(o, kTol, "delta_rule output");
      f.same(state, kTol, "delta_rule state");
    }
  }
  // a head whose state cannot fit in shared memory: refused, naming why
  const int64_t hd = xpack::rt::kimi::delta_rule_max_head_dim() + 1, H = 1;
  const Both x = f.alloc(hd * H, 1), beta = f.alloc(H, 1), state = f.alloc(hd * hd, H), o = f.alloc(hd * H, 1);
  try {
    f.gpu_ops->delta_rule(x.gpu, x.gpu, x.gpu, x.gpu, beta.gpu, state.gpu, o.gpu);
    FAIL("delta_rule accepted a state over shared memory");
  } catch (const ModelError& e) {
    CHECK(std::string(e.what()).find("shared memory") != std::string::npos);
  }
}

namespace {

// Delta-rule inputs as KdaLayer feeds them (test/runtime/delta_rule_inputs.h,
// shared with the CPU test).
using delta_rule_test::Beta;
using delta_rule_test::Gate;
using DeltaInputs = delta_rule_test::Inputs;
DeltaInputs delta_inputs(int64_t n, int64_t H, int64_t hd, Gate gate, Beta bm, uint32_t seed) {
  return delta_rule_test::make_inputs(n, H, hd, gate, bm, seed);
}

// The chunked form against the recurrent step: the same sums in other orders.
constexpr double kChunkTol = 2e-5;

}  // namespace

TEST_CASE("kimi ops on CUDA: the chunked delta rule equals the recurrent step (and the CPU's chunked form)") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t H = 3;
  uint32_t seed = 900;
  double seen = 0;
  for (int64_t hd : {16, 48, 128}) {
    for (int64_t C : {16, 64}) {
      for (int64_t n : {1, 15, 16, 17, 64, 65, 200}) {
        for (Gate gate : {Gate::mixed, Gate::saturated, Gate::unbounded}) {
          for (Beta bm : {Beta::zero, Beta::one, Beta::random}) {
            CAPTURE(hd);
            CAPTURE(C);
            CAPTURE(n);
            CAPTURE(int(gate));
            CAPTURE(int(bm));
            const int64_t D = H * hd;
            const DeltaInputs in = delta_inputs(n, H, hd, gate, bm, seed++);
            const auto s0 = random_floats(size_t(hd * hd * H), seed++, 2.0f);  // a non-zero start state
            const Both q = f.up(in.q, D), k = f.up(in.k, D), v = f.up(in.v, D), g = f.up(in.g, D),
                       beta = f.up(in.beta, H);
            const Both s_rec = f.up(s0, hd * hd), s_chk = f.up(s0, hd * hd);
            const Both o_rec = f.alloc(D, n), o_chk = f.alloc(D, n);
            f.gpu_ops->delta_rule(q.gpu, k.gpu, v.gpu, g.gpu, beta.gpu, s_rec.gpu, o_rec.gpu);
            f.gpu_ops->delta_rule_chunked(q.gpu, k.gpu, v.gpu, g.gpu, beta.gpu, s_chk.gpu, o_chk.gpu, C);
            // cpu: the CPU's chunked form; gpu: CUDA's chunked form
            f.cpu_ops->delta_rule_chunked(q.cpu, k.cpu, v.cpu, g.cpu, beta.cpu, s_chk.cpu, o_chk.cpu, C);
            f.same(o_chk, kChunkTol, "chunked output, CUDA vs CPU");
            f.same(s_chk, kChunkTol, "chunked state, CUDA vs CPU");
            // against CUDA's recurrent step (itself within 1e-5 of the CPU's)
            std::vector<float> a(size_t(D * n)), b(size_t(D * n)), sa(size_t(hd * hd * H)), sb(sa.size());
            f.gpu.download(o_rec.gpu, a.data());
            f.gpu.download(o_chk.gpu, b.data());
            f.gpu.download(s_rec.gpu, sa.data());
            f.gpu.download(s_chk.gpu, sb.data());
            auto worst = [](const std::vector<float>& x, const std::vector<float>& y) {
              double w = 0;
              for (size_t i = 0; i < x.size(); ++i) {
                REQUIRE(std::isfinite(y[i]));
                w = std::max(w, std::fabs(double(x[i]) - double(y[i])) / (1.0 + std::fabs(double(x[i]))));
              }
              return w;
            };
            const double d_o = worst(a, b), d_s = worst(sa, sb);
            INFO("CUDA chunked vs recurrent: output " << d_o << ", state " << d_s);
            CHECK(d_o <= kChunkTol);
            CHECK(d_s <= kChunkTol);
            seen = std::max({seen, d_o, d_s});
          }
        }
      }
    }
  }
  MESSAGE("CUDA: worst relative difference, chunked vs recurrent: " << seen);
}

TEST_CASE("kimi ops on CUDA: a chunked prefill split in two calls, then decode steps, equals the recurrent step") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t H = 4, hd = 128, D = H * hd, n = 1100;  // over the 512-token segment: three segments
  const DeltaInputs in = delta_inputs(n, H, hd, Gate::mixed, Beta::random, 950);
  const auto s0 = random_floats(size_t(hd * hd * H), 951, 2.0f);
  const Tensor s_rec = f.gpu.upload(XPACK_TYPE_F32, s0.data(), hd * hd, H);
  const Tensor s_chk = f.gpu.upload(XPACK_TYPE_F32, s0.data(), hd * hd, H);
  auto rows = [&](const std::vector<float>& x, int64_t w, int64_t r0, int64_t nr) {
    return f.gpu.upload(XPACK_TYPE_F32, x.data() + r0 * w, w, nr);
  };
  std::vector<float> want(size_t(D * n)), got(size_t(D * n));
  {
    const Tensor o = f.gpu.alloc(XPACK_TYPE_F32, D, n);
    f.gpu_ops->delta_rule(rows(in.q, D, 0, n), rows(in.k, D, 0, n), rows(in.v, D, 0, n), rows(in.g, D, 0, n),
                          rows(in.beta, H, 0, n), s_rec, o);
    f.gpu.download(o, want.data());
  }
  for (auto [r0, nr] : {std::pair<int64_t, int64_t>{0, 333}, {333, n - 333}}) {
    const Tensor o = f.gpu.alloc(XPACK_TYPE_F32, D, nr);
    f.gpu_ops->delta_rule_chunked(rows(in.q, D, r0, nr), rows(in.k, D, r0, nr), rows(in.v, D, r0, nr),
                                  rows(in.g, D, r0, nr), rows(in.beta, H, r0, nr), s_chk, o, 64);
    f.gpu.download(o, got.data() + r0 * D);
  }
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(double(want[i]) - got[i]) / (1.0 + std::fabs(double(want[i]))));
  CHECK(worst <= kChunkTol);
  // decode on both states
  const DeltaInputs more = delta_inputs(2, H, hd, Gate::mixed, Beta::random, 952);
  std::vector<float> a(size_t(D * 2)), b(size_t(D * 2));
  for (const Tensor* st : {&s_rec, &s_chk}) {
    const Tensor o = f.gpu.alloc(XPACK_TYPE_F32, D, 2);
    f.gpu_ops->delta_rule(rows(more.q, D, 0, 2), rows(more.k, D, 0, 2), rows(more.v, D, 0, 2), rows(more.g, D, 0, 2),
                          rows(more.beta, H, 0, 2), *st, o);
    f.gpu.download(o, st == &s_rec ? a.data() : b.data());
  }
  double worst_dec = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst_dec = std::max(worst_dec, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(a[i]))));
  CHECK(worst_dec <= kChunkTol);
  MESSAGE("1100 tokens in two chunked calls: worst " << worst << ", decode after: " << worst_dec);
}

TEST_CASE("kimi ops on CUDA: the chunked delta rule refuses head dims and chunks over its kernel's limits") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  namespace kk = xpack::rt::kimi;
  CHECK(f.gpu_ops->delta_rule_chunk(128) > 0);
  CHECK(f.gpu_ops->delta_rule_chunk(18) == 0);  // KdaLayer falls back to the recurrent step
  CHECK(f.gpu_ops->delta_rule_chunk(kk::kChunkMaxHeadDim + 4) == 0);
  for (int64_t hd : {int64_t(18), kk::kChunkMaxHeadDim + 4}) {
    const int64_t H = 2, D = H * hd;
    const Both x = f.alloc(D, 3), beta = f.alloc(H, 3), state = f.alloc(hd * hd, H), o = f.alloc(D, 3);
    try {
      f.gpu_ops->delta_rule_chunked(x.gpu, x.gpu, x.gpu, x.gpu, beta.gpu, state.gpu, o.gpu, 16);
      FAIL("delta_rule_chunked accepted head_dim " << hd);
    } catch (const ModelError& e) {
      CHECK(std::string(e.what()).find("head_dim") != std::string::npos);
    }
  }
  const int64_t H = 2, hd = 32, D = H * hd;
  const Both x = f.alloc(D, 3), beta = f.alloc(H, 3), state = f.alloc(hd * hd, H), o = f.alloc(D, 3);
  for (int64_t C : {int64_t(0), int64_t(6), kk::kMaxChunk + 4})
    CHECK_THROWS_AS(f.gpu_ops->delta_rule_chunked(x.gpu, x.gpu, x.gpu, x.gpu, beta.gpu, state.gpu, o.gpu, C),
                    ModelError);
  const Both short_o = f.alloc(D, 2);
  CHECK_THROWS_AS(f.gpu_ops->delta_rule_chunked(x.gpu, x.gpu, x.gpu, x.gpu, beta.gpu, state.gpu, short_o.gpu, 16),
                  ModelError);
}

TEST_CASE("kimi ops on CUDA: time of the chunked delta rule and the recurrent step at Kimi-K3's dims") {
  if (!xpack::test::gpu::available()) return;
  // 96 heads of 128, a 512-token prefill (random inputs); the chunked result is
  // checked against the recurrent one here too
  Fixture f;
  const int64_t H = 96, hd = 128, D = H * hd, n = 512;
  const DeltaInputs in = delta_inputs(n, H, hd, Gate::mixed, Beta::random, 990);
  const auto s0 = random_floats(size_t(hd * hd * H), 991, 0.5f);
  const Tensor q = f.gpu.upload(XPACK_TYPE_F32, in.q.data(), D, n), k = f.gpu.upload(XPACK_TYPE_F32, in.k.data(), D, n),
               v = f.gpu.upload(XPACK_TYPE_F32, in.v.data(), D, n), g = f.gpu.upload(XPACK_TYPE_F32, in.g.data(), D, n),
               beta = f.gpu.upload(XPACK_TYPE_F32, in.beta.data(), H, n);
  const cudaStream_t stream = static_cast<cudaStream_t>(f.gpu.stream());
  std::vector<float> want(size_t(D * n)), got(want.size());
  for (int64_t C : {int64_t(0), int64_t(16), int64_t(32), int64_t(64)}) {
    const Tensor o = f.gpu.alloc(XPACK_TYPE_F32, D, n);
    std::vector<double> ms;
    for (int rep = 0; rep < 6; ++rep) {
      const Tensor s = f.gpu.upload(XPACK_TYPE_F32, s0.data(), hd * hd, H);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      const auto t0 = std::chrono::steady_clock::now();
      if (C == 0)
        f.gpu_ops->delta_rule(q, k, v, g, beta, s, o);
      else
        f.gpu_ops->delta_rule_chunked(q, k, v, g, beta, s, o, C);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      if (rep > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    f.gpu.download(o, C == 0 ? want.data() : got.data());
    double worst = 0;
    if (C != 0)
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::fabs(double(want[i]) - got[i]) / (1.0 + std::fabs(double(want[i]))));
    CHECK(worst <= kChunkTol);
    MESSAGE((C == 0 ? std::string("recurrent") : "chunked C=" + std::to_string(C))
            << ": median " << ms[ms.size() / 2] << " ms, min " << ms.front() << " ms (512 tokens, 96 heads of 128)"
            << (C ? ", worst vs recurrent " + std::to_string(worst) : std::string()));
  }
}

TEST_CASE("kimi ops on CUDA: absorbed MLA attention, by the kernel and by the batched prefill, equals the CPU "
          "(offsets, many keys, no rope part)") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  struct Shape {
    int64_t H, nope, rope, kv, hv, pos0, n;
  } shapes[] = {
      // under 16 query tokens and 512 keys: the one-kernel path
      {4, 32, 16, 64, 32, 0, 7},     // the oracle models' MLA, a prefill from position 0
      {4, 32, 16, 64, 32, 7, 1},     // then one decode step
      {2, 128, 64, 512, 128, 290, 3},  // Kimi-K3's widths, many keys
      {3, 24, 0, 40, 16, 5, 2},      // nope-only (no rope-part key)
      {4, 32, 16, 64, 32, 510, 1},   // 511 keys: the kernel's last decode step
      // a decode step of 512 keys or more: the batched products
      {4, 32, 16, 64, 32, 511, 1},
      {2, 128, 64, 512, 128, 700, 3},
      {3, 24, 0, 40, 16, 600, 1},
      // 16 or more: the batched prefill (cuBLAS products around the causal softmax)
      {4, 32, 16, 64, 32, 0, 40},       // from position 0
      {2, 128, 64, 512, 128, 290, 300},  // Kimi-K3's widths at an offset, two chunks (256 + 44 tokens)
      {3, 24, 0, 40, 16, 5, 20},        // no rope part
      // more positions than the kernel's shared memory holds: the batched path has no such limit
      {2, 32, 16, 64, 32, xpack::rt::kimi::mla_max_keys(64), 16},
  };
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    CAPTURE(s.kv);
    CAPTURE(s.pos0);
    CAPTURE(s.n);
    const int64_t n_kv = s.pos0 + s.n + 2;  // the cache may hold more rows than are visible
    const Both q = f.up(random_floats(size_t(s.n * s.H * (s.nope + s.rope)), seed++, 0.5f), s.H * (s.nope + s.rope));
    const Both latent = f.up(random_floats(size_t(n_kv * s.kv), seed++, 1.0f), s.kv);
    Both rope_key = f.alloc(s.rope, n_kv);
    if (s.rope > 0) rope_key = f.up(random_floats(size_t(n_kv * s.rope), seed++, 1.0f), s.rope);
    const Both k_b = f.up(random_floats(size_t(s.H * s.kv * s.nope), seed++, 0.3f), s.nope);
    const Both v_b = f.up(random_floats(size_t(s.H * s.hv * s.kv), seed++, 0.3f), s.kv);
    const Both o = f.alloc(s.H * s.hv, s.n);
    const float scale = 1.0f / std::sqrt(float(s.nope + s.rope));
    f.cpu_ops->mla_attention(q.cpu, latent.cpu, rope_key.cpu, k_b.cpu, v_b.cpu, s.H, s.pos0, scale, o.cpu);
    f.gpu_ops->mla_attention(q.gpu, latent.gpu, rope_key.gpu, k_b.gpu, v_b.gpu, s.H, s.pos0, scale, o.gpu);
    f.same(o, kTol, "mla_attention");
  }
  // shapes that disagree; more positions than the kernel's shared memory holds: a
  // decode step takes the batched products there, and the kernel (forced) refuses
  const int64_t kv = 64, too_many = xpack::rt::kimi::mla_max_keys(kv) + 1;
  const Both q = f.up(random_floats(size_t(2 * 48), seed++, 0.5f), 2 * 48);
  const Both k_b = f.up(random_floats(size_t(2 * kv * 32), seed++, 0.3f), 32);
  const Both v_b = f.up(random_floats(size_t(2 * 32 * kv), seed++, 0.3f), kv);
  const Both latent = f.up(random_floats(size_t(too_many * kv), seed++, 1.0f), kv);
  const Both rope_key = f.up(random_floats(size_t(too_many * 16), seed++, 1.0f), 16);
  const Both o = f.alloc(2 * 32, 1);
  CHECK_THROWS_AS(f.gpu_ops->mla_attention(q.gpu, latent.gpu, rope_key.gpu, k_b.gpu, v_b.gpu, 3, 0, 1.0f, o.gpu),
                  ModelError);
  f.cpu_ops->mla_attention(q.cpu, latent.cpu, rope_key.cpu, k_b.cpu, v_b.cpu, 2, too_many - 1, 0.1f, o.cpu);
  f.gpu_ops->mla_attention(q.gpu, latent.gpu, rope_key.gpu, k_b.gpu, v_b.gpu, 2, too_many - 1, 0.1f, o.gpu);
  f.same(o, kTol, "mla_attention, a decode step over more keys than the kernel holds");
  set_cuda_mla_product_keys(int64_t(1) << 40);  // the kernel alone
  try {
    f.gpu_ops->mla_attention(q.gpu, latent.gpu, rope_key.gpu, k_b.gpu, v_b.gpu, 2, too_many - 1, 1.0f, o.gpu);
    FAIL("mla_attention accepted more keys than fit");
  } catch (const ModelError& e) {
    CHECK(std::string(e.what()).find("shared memory") != std::string::npos);
  }
  set_cuda_mla_product_keys(-1);
}

// Kimi-K3's MLA (96 heads, latent 512, nope 128, rope 64, values 128) for one
// decode step at 64..8192 keys, by the one-kernel path and by the batched
// products (set_cuda_mla_product_keys forces each), side by side; both within the
// bound of each other. The default's switch point (512 keys) comes from here.
TEST_CASE("kimi ops on CUDA: time of a decode step's MLA by the kernel and by the products, 64 to 8192 keys") {
  if (!xpack::test::gpu::available()) return;
  Fixture f;
  const int64_t H = 96, nope = 128, rope = 64, kv = 512, hv = 128, max_keys = 8192;
  const Both q = f.up(random_floats(size_t(H * (nope + rope)), 1200, 0.5f), H * (nope + rope));
  const Both latent = f.up(random_floats(size_t(max_keys * kv), 1201, 1.0f), kv);
  const Both rope_key = f.up(random_floats(size_t(max_keys * rope), 1202, 1.0f), rope);
  const Both k_b = f.up(random_floats(size_t(H * kv * nope), 1203, 0.3f), nope);
  const Both v_b = f.up(random_floats(size_t(H * hv * kv), 1204, 0.3f), kv);
  const float scale = 1.0f / std::sqrt(float(nope + rope));
  const cudaStream_t stream = static_cast<cudaStream_t>(f.gpu.stream());
  for (const int64_t keys : {int64_t(64), int64_t(256), int64_t(512), int64_t(1024), int64_t(4096), max_keys}) {
    CAPTURE(keys);
    std::vector<float> outs[2];
    double us[2] = {0, 0};
    for (const int path : {0, 1}) {  // 0: the kernel, 1: the products
      set_cuda_mla_product_keys(path == 0 ? int64_t(1) << 40 : 0);
      const Tensor o = f.gpu.alloc(XPACK_TYPE_F32, H * hv, 1);
      std::vector<double> t;
      for (int rep = 0; rep < 12; ++rep) {
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i)
          f.gpu_ops->mla_attention(q.gpu, latent.gpu, rope_key.gpu, k_b.gpu, v_b.gpu, H, keys - 1, scale, o);
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        if (rep > 1) t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 10);
      }
      std::sort(t.begin(), t.end());
      us[path] = t[t.size() / 2];
      outs[path].resize(size_t(H * hv));
      f.gpu.download(o, outs[path].data());
    }
    double worst = 0;
    for (size_t i = 0; i < outs[0].size(); ++i)
      worst = std::max(worst, std::fabs(double(outs[0][i]) - outs[1][i]) / (1.0 + std::fabs(double(outs[0][i]))));
    CHECK(worst <= kTol);
    MESSAGE("MLA decode step, " << keys << " keys: kernel " << us[0] << " us, products " << us[1]
                                << " us (wall per call, median)");
  }
  set_cuda_mla_product_keys(-1);
}
