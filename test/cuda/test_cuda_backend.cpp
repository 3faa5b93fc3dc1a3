// xpack-run's CUDA backend op by op against its CPU backend (itself tested
// against double references in test/runtime/test_cpu_backend.cpp): the same
// random inputs through both, results within float rounding (integer results
// exactly), including the in-place forms and the shapes the graphs use (row
// broadcast, grouped-query heads, a position offset, RoPE's tail and YaRN
// modes). The end-to-end tests only see whole models; this one names the op.
// Without a CUDA device every case is skipped (exit 77).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "gpu_available.h"
#include "quant_mma.h"
#include "skip.h"
#include "xpack/xpack.h"

using namespace xrun;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// One tensor on both backends.
struct Both {
  Tensor cpu, gpu;
};

struct Backends {
  CpuBackend cpu{2};
  CudaBackend gpu{0};

  Both up(uint32_t type, const void* host, int64_t width, int64_t rows) {
    return {cpu.upload(type, host, width, rows), gpu.upload(type, host, width, rows)};
  }
  Both up(const std::vector<float>& v, int64_t width) {
    return up(XPACK_TYPE_F32, v.data(), width, static_cast<int64_t>(v.size()) / width);
  }
  Both up(const std::vector<int32_t>& v, int64_t width) {
    return up(XPACK_TYPE_I32, v.data(), width, static_cast<int64_t>(v.size()) / width);
  }
  Both alloc(uint32_t type, int64_t width, int64_t rows) { return {cpu.alloc(type, width, rows), gpu.alloc(type, width, rows)}; }

  template <typename T>
  std::pair<std::vector<T>, std::vector<T>> down(const Both& t) {
    std::vector<T> a(static_cast<size_t>(t.cpu.numel())), b(static_cast<size_t>(t.gpu.numel()));
    cpu.download(t.cpu, a.data());
    gpu.download(t.gpu, b.data());
    return {a, b};
  }
  // Float results agree to `tol` relative to 1 + |cpu|.
  void same(const Both& t, double tol, const char* what) {
    auto [a, b] = down<float>(t);
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE(std::isfinite(b[i]));
      worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1.0 + std::abs(double(a[i]))));
    }
    INFO(what << ": worst relative difference " << worst);
    CHECK(worst <= tol);
  }
  // Float results agree within bound[i] each (a dot product's: test below).
  void within(const Both& t, const std::vector<double>& bound, const char* what) {
    auto [a, b] = down<float>(t);
    REQUIRE(a.size() == bound.size());
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(std::abs(double(a[i]) - double(b[i])) <= bound[i])) ++bad;
    INFO(what << ": " << bad << " of " << a.size() << " outside the bound");
    CHECK(bad == 0);
  }
  void same_ints(const Both& t, const char* what) {
    auto [a, b] = down<int32_t>(t);
    INFO(what);
    CHECK(a == b);
  }
};

constexpr double kTol = 2e-6;

// Two fp32 sums of the same ne0 products in different orders differ by at most
// 2 ne0 2^-24 sum |w x| (each within ne0 u of the exact sum): the bound for each
// output y[t][r] of rows w (ne0 floats each) against x (n tokens of ne0).
std::vector<double> dot_bound(const std::vector<float>& w, int64_t rows, const std::vector<float>& x, int64_t ne0) {
  const int64_t n = int64_t(x.size()) / ne0;
  std::vector<double> b(size_t(rows * n));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0;
      for (int64_t k = 0; k < ne0; ++k) m += std::abs(double(w[size_t(r * ne0 + k)]) * double(x[size_t(t * ne0 + k)]));
      b[size_t(t * rows + r)] = 2.0 * double(ne0) * 0x1p-24 * m + 1e-30;
    }
  return b;
}

// Q8_0 rows as q8_0_rows makes them, decoded (the scale is 1/16).
std::vector<float> q8_0_values(const std::vector<uint8_t>& q) {
  std::vector<float> v;
  for (size_t b = 0; b < q.size(); b += 34)
    for (int i = 0; i < 32; ++i) v.push_back(float(int8_t(q[b + 2 + size_t(i)])) / 16.0f);
  return v;
}

// Q8_0 rows: per block of 32 an fp16 scale (0x2c00 = 1/16) and 32 int8.
std::vector<uint8_t> q8_0_rows(int64_t ne0, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> q(static_cast<size_t>(ne0 / 32 * 34 * rows));
  for (size_t b = 0; b < q.size(); b += 34) {
    q[b] = 0x00;
    q[b + 1] = 0x2c;
    for (int i = 0; i < 32; ++i) q[b + 2 + i] = static_cast<uint8_t>(rng());
  }
  return q;
}

}  // namespace

TEST_CASE("cuda backend: norms, elementwise ops and activations equal the CPU backend's") {
  if (!xpack::test::gpu::available()) return;
  Backends be;
  const int64_t w = 96, n = 5;
  const std::vector<float> xv = random_floats(size_t(w * n), 1, 3.0f), yv = random_floats(size_t(w * n), 2, 3.0f);
  const std::vector<float> rowv = random_floats(size_t(w), 3);
  const Both x = be.up(xv, w), y = be.up(yv, w), row = be.up(rowv, w);

  Both o = be.alloc(XPACK_TYPE_F32, w, n);
  be.cpu.rms_norm(x.cpu, &row.cpu, 1e-6f, o.cpu);
  be.gpu.rms_norm(x.gpu, &row.gpu, 1e-6f, o.gpu);
  be.same(o, kTol, "rms_norm with weight");
  Both inplace = be.up(xv, w);
  be.cpu.rms_norm(inplace.cpu, nullptr, 1e-5f, inplace.cpu);
  be.gpu.rms_norm(inplace.gpu, nullptr, 1e-5f, inplace.gpu);
  be.same(inplace, kTol, "rms_norm in place, no weight");

  be.cpu.add(x.cpu, row.cpu, o.cpu);
  be.gpu.add(x.gpu, row.gpu, o.gpu);
  be.same(o, 0.0, "add of one broadcast row");
  be.cpu.add(x.cpu, y.cpu, o.cpu);
  be.gpu.add(x.gpu, y.gpu, o.gpu);
  be.same(o, 0.0, "add");
  be.cpu.mul(x.cpu, y.cpu, o.cpu);
  be.gpu.mul(x.gpu, y.gpu, o.gpu);
  be.same(o, 0.0, "mul");
  be.cpu.scale(x.cpu, -0.37f, o.cpu);
  be.gpu.scale(x.gpu, -0.37f, o.gpu);
  be.same(o, 0.0, "scale");
  be.cpu.l2_norm(x.cpu, 1e-6f, o.cpu);
  be.gpu.l2_norm(x.gpu, 1e-6f, o.gpu);
  be.same(o, kTol, "l2_norm");
  {
    // Rows long enough for the kernels' batches of loads (block_reduce.cuh:
    // eight per thread of a block of up to 1024), plus a tail.
    const int64_t wide = 8 * 1024 * 2 + 3 * 1024 + 5;
    const std::vector<float> xw = random_floats(size_t(wide * 2), 7, 3.0f), ww = random_floats(size_t(wide), 8);
    const Both a = be.up(xw, wide), g = be.up(ww, wide);
    Both out = be.alloc(XPACK_TYPE_F32, wide, 2);
    be.cpu.rms_norm(a.cpu, &g.cpu, 1e-6f, out.cpu);
    be.gpu.rms_norm(a.gpu, &g.gpu, 1e-6f, out.gpu);
    be.same(out, kTol, "rms_norm of wide rows");
    be.cpu.l2_norm(a.cpu, 1e-6f, out.cpu);
    be.gpu.l2_norm(a.gpu, 1e-6f, out.gpu);
    be.same(out, kTol, "l2_norm of wide rows");
    Both in = be.up(xw, wide);
    be.cpu.rms_norm(in.cpu, nullptr, 1e-5f, in.cpu);
    be.gpu.rms_norm(in.gpu, nullptr, 1e-5f, in.gpu);
    be.same(in, kTol, "rms_norm of wide rows in place");
  }
  for (Unary f : {Unary::sigmoid, Unary::sqrt_softplus}) {
    // Large arguments too: sqrt_softplus switches form above 20.
    const std::vector<float> big = random_floats(size_t(w * n), 4, 30.0f);
    const Both b = be.up(big, w);
    be.cpu.unary(f, b.cpu, o.cpu);
    be.gpu.unary(f, b.gpu, o.gpu);
    be.same(o, 4 * kTol, f == Unary::sigmoid ? "sigmoid" : "sqrt_softplus");
  }
  for (float limit : {0.0f, 1.5f}) {
    be.cpu.swiglu(x.cpu, y.cpu, limit, o.cpu);
    be.gpu.swiglu(x.gpu, y.gpu, limit, o.gpu);
    be.same(o, 4 * kTol, limit > 0 ? "clamped swiglu" : "swiglu");
  }
  Both s = be.up(xv, w);
  be.cpu.softmax_rows(s.cpu);
  be.gpu.softmax_rows(s.gpu);
  be.same(s, kTol, "softmax_rows");
  Both nr = be.up(random_floats(size_t(w * n), 5, 1.0f), w);
  be.cpu.normalize_rows(nr.cpu, 6.1e-5f);
  be.gpu.normalize_rows(nr.gpu, 6.1e-5f);
  be.same(nr, kTol, "normalize_rows");
}

TEST_CASE("cuda backend: top_k (ties to the lower index), take, get_rows, set_rows, copy") {
  if (!xpack::test::gpu::available()) return;
  Backends be;
  const int64_t w = 64, n = 4, k = 6;
  std::vector<float> sv = random_floats(size_t(w * n), 6);
  for (int64_t t = 0; t < n; ++t) sv[size_t(t * w + 9)] = sv[size_t(t * w + 40)] = 2.0f;  // a tie at the top
  const Both scores = be.up(sv, w);
  Both ids = be.alloc(XPACK_TYPE_I32, k, n);
  be.cpu.top_k(scores.cpu, ids.cpu);
  be.gpu.top_k(scores.gpu, ids.gpu);
  be.same_ints(ids, "top_k");
  // Router widths (one warp's registers up to 1024 scores, the block's passes
  // beyond), with many ties, both zeros (equal), infinities, and k up to n.
  for (const int64_t width : {int64_t(7), int64_t(256), int64_t(896), int64_t(1024), int64_t(1025), int64_t(3000)}) {
    for (const int64_t pick : {int64_t(1), int64_t(6), int64_t(16), width}) {
      if (pick > width) continue;
      CAPTURE(width);
      CAPTURE(pick);
      std::vector<float> tv = random_floats(size_t(width * 3), 13);
      for (size_t i = 0; i < tv.size(); ++i) {
        tv[i] = std::round(tv[i] * 4.0f) / 4.0f;  // few distinct values: ties everywhere
        if (i % 11 == 0) tv[i] = (i / 11) % 2 ? 0.0f : -0.0f;
      }
      tv[size_t(width) - 1] = INFINITY;
      tv[size_t(width)] = -INFINITY;
      const Both ts = be.up(tv, width);
      Both tid = be.alloc(XPACK_TYPE_I32, pick, 3);
      be.cpu.top_k(ts.cpu, tid.cpu);
      be.gpu.top_k(ts.gpu, tid.gpu);
      be.same_ints(tid, "top_k at router widths");
    }
  }
  Both taken = be.alloc(XPACK_TYPE_F32, k, n);
  be.cpu.take(scores.cpu, ids.cpu, taken.cpu);
  be.gpu.take(scores.gpu, ids.gpu, taken.gpu);
  be.same(taken, 0.0, "take");

  const std::vector<int32_t> rows = {3, 0, 3, 7, 1};
  const Both rid = be.up(rows, 1);
  const Both table = be.up(random_floats(size_t(w * 8), 7), w);
  Both got = be.alloc(XPACK_TYPE_F32, w, 5);
  be.cpu.get_rows(table.cpu, rid.cpu, got.cpu);
  be.gpu.get_rows(table.gpu, rid.gpu, got.gpu);
  be.same(got, 0.0, "get_rows F32");
  const std::vector<uint8_t> q = q8_0_rows(w, 8, 8);
  const Both qtable = be.up(XPACK_TYPE_Q8_0, q.data(), w, 8);
  be.cpu.get_rows(qtable.cpu, rid.cpu, got.cpu);
  be.gpu.get_rows(qtable.gpu, rid.gpu, got.gpu);
  be.same(got, 0.0, "get_rows Q8_0 (dequantized)");
  std::vector<int32_t> itab(8 * 3);
  for (size_t i = 0; i < itab.size(); ++i) itab[i] = int32_t(i * 7 + 1);
  const Both itable = be.up(itab, 3);
  Both igot = be.alloc(XPACK_TYPE_I32, 3, 5);
  be.cpu.get_rows(itable.cpu, rid.cpu, igot.cpu);
  be.gpu.get_rows(itable.gpu, rid.gpu, igot.gpu);
  be.same_ints(igot, "get_rows I32");

  const std::vector<int32_t> dst_rows = {6, 2, 0};
  const Both did = be.up(dst_rows, 1);
  const Both src = be.up(random_floats(size_t(w * 3), 9), w);
  Both dst = be.up(random_floats(size_t(w * 8), 10), w);
  be.cpu.set_rows(src.cpu, did.cpu, dst.cpu);
  be.gpu.set_rows(src.gpu, did.gpu, dst.gpu);
  be.same(dst, 0.0, "set_rows");
  Both cp = be.alloc(XPACK_TYPE_F32, w, 2);
  be.cpu.copy(dst.cpu.row_range(3, 2), cp.cpu);
  be.gpu.copy(dst.gpu.row_range(3, 2), cp.gpu);
  be.same(cp, 0.0, "copy of a row range");
}

TEST_CASE("cuda backend: route in one launch equals its chain of operations, bit for bit") {
  if (!xpack::test::gpu::available()) return;
  Backends be;
  // Kimi-K3's 896 experts top-16 with a bias, deepseek4's 256 top-6, and hash
  // routing (ids given): every form the models use.
  struct Form {
    int64_t experts, k;
    std::optional<Unary> gate;
    bool bias, select, normalize;
    float scale;
  };
  const Form forms[] = {{896, 16, Unary::sigmoid, true, true, true, 2.827f},
                        {256, 6, Unary::sqrt_softplus, true, true, true, 1.5f},
                        {256, 6, Unary::sqrt_softplus, false, false, true, 1.5f},
                        {64, 4, std::nullopt, false, true, false, 1.0f}};
  for (const Form& f : forms) {
    CAPTURE(f.experts);
    CAPTURE(f.k);
    const int64_t n = 5;
    std::vector<float> lv = random_floats(size_t(f.experts * n), 11, 4.0f);
    for (int64_t t = 0; t < n; ++t) lv[size_t(t * f.experts + 3)] = lv[size_t(t * f.experts + 17)] = 9.0f;  // a tie
    const Tensor bias = be.gpu.upload(XPACK_TYPE_F32, random_floats(size_t(f.experts), 12, 0.1f).data(), f.experts, 1);
    std::vector<int32_t> given(size_t(n * f.k));
    for (size_t i = 0; i < given.size(); ++i) given[i] = int32_t((i * 37 + 5) % size_t(f.experts));
    Backend::RouteSpec spec;
    spec.gate = f.gate;
    spec.bias = f.bias ? &bias : nullptr;
    spec.select = f.select;
    spec.normalize = f.normalize;
    spec.floor = 6.103515625e-5f;
    spec.scale = f.scale;
    std::vector<float> logits[2], weights[2];
    std::vector<int32_t> ids[2];
    for (int fused = 0; fused < 2; ++fused) {
      const Tensor l = be.gpu.upload(XPACK_TYPE_F32, lv.data(), f.experts, n);
      const Tensor i = be.gpu.upload(XPACK_TYPE_I32, given.data(), f.k, n);
      const Tensor w = be.gpu.empty(XPACK_TYPE_F32, f.k, n);
      if (fused)
        be.gpu.route(l, spec, i, w);
      else
        be.gpu.Backend::route(l, spec, i, w);
      logits[fused].resize(lv.size());
      weights[fused].resize(given.size());
      ids[fused].resize(given.size());
      be.gpu.download(l, logits[fused].data());
      be.gpu.download(w, weights[fused].data());
      be.gpu.download(i, ids[fused].data());
    }
    CHECK(ids[1] == ids[0]);
    CHECK(std::memcmp(weights[1].data(), weights[0].data(), weights[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(logits[1].data(), logits[0].data(), logits[0].size() * sizeof(float)) == 0);
    if (!f.select) CHECK(ids[1] == given);
    if (f.select) {  // ties to the lower index, whatever the gate did to them
      for (int64_t t = 0; t < n; ++t) {
        const int32_t* r = ids[1].data() + t * f.k;
        const auto at3 = std::find(r, r + f.k, 3), at17 = std::find(r, r + f.k, 17);
        if (!f.bias && at17 != r + f.k) CHECK(at3 < at17);
      }
    }
  }
}

TEST_CASE("cuda backend: a download in two halves gives the bytes as they were at its start, small or large") {
  if (!xpack::test::gpu::available()) return;
  CudaBackend be(0);
  // 1000 floats take the pinned early copy; 600k (2.4 MB) the plain download at the start.
  for (const size_t n : {size_t(1000), size_t(600000)}) {
    CAPTURE(n);
    const std::vector<float> v = random_floats(n, 11);
    const Tensor t = be.upload(XPACK_TYPE_F32, v.data(), int64_t(n), 1);
    std::vector<float> got(n, 0.0f);
    be.start_download(t);
    be.scale(t, 2.0f, t);  // enqueued between the halves, on the source itself
    be.finish_download(got.data());
    CHECK(std::memcmp(got.data(), v.data(), n * 4) == 0);
    be.download(t, got.data());  // and the work between them did run
    CHECK(got[0] == 2.0f * v[0]);
    CHECK_THROWS_AS(be.finish_download(got.data()), ModelError);
  }
}

TEST_CASE("cuda backend: the products' workspace is fitted to the widest weight's split, unless a size was asked") {
  if (!xpack::test::gpu::available()) return;
  constexpr size_t kMiB = size_t(1) << 20;
  // A Q8_0 weight of 32768 inputs: its split of kWorkspaceRows tokens (6 bytes an
  // input and token) is far above the 64 MiB default; one of 256 inputs is below it.
  const int64_t wide = 32768, narrow = 256, rows = 16, tokens = 40;
  const std::vector<uint8_t> qw = q8_0_rows(wide, rows, 31), qn = q8_0_rows(narrow, rows, 32);
  const auto weight_of = [](const std::vector<uint8_t>& q, int64_t ne0, int64_t ne1) {
    WeightTensor w;
    w.name = "w";
    w.type = XPACK_TYPE_Q8_0;
    w.n_dims = 2;
    w.ne[0] = ne0;
    w.ne[1] = ne1;
    w.data = q.data();
    w.nbytes = q.size();
    return w;
  };
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  const size_t split = xpack::kernels::dev::mma_split_bytes(XPACK_TYPE_Q8_0, wide, CudaBackend::kWorkspaceRows);
  REQUIRE(split > 64 * kMiB);
  const size_t fitted = std::min(split, std::max(64 * kMiB, total_b / 32));
  const std::vector<float> xs = random_floats(size_t(wide * tokens), 33);
  {
    CudaBackend be(0);
    CHECK(be.workspace_bytes() == (64 + 32) * kMiB);
    const Tensor n = be.weight(weight_of(qn, narrow, rows));
    be.fit_workspace();
    CHECK(be.workspace_bytes() == (64 + 32) * kMiB);
    // The same product before and after the workspace grows: the same bits.
    const Tensor w = be.weight(weight_of(qw, wide, rows));
    const Tensor x = be.upload(XPACK_TYPE_F32, xs.data(), wide, tokens);
    const Tensor y = be.alloc(XPACK_TYPE_F32, rows, tokens);
    std::vector<float> before(size_t(rows * tokens)), after(before.size());
    be.matmul(w, x, y);
    be.download(y, before.data());
    be.fit_workspace();
    CHECK(be.workspace_bytes() == fitted + 32 * kMiB);
    be.scale(y, 0.0f, y);
    be.matmul(w, x, y);
    be.download(y, after.data());
    CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
    CHECK(std::any_of(after.begin(), after.end(), [](float v) { return v != 0.0f; }));
    be.fit_workspace();  // again: nothing more to grow
    CHECK(be.workspace_bytes() == fitted + 32 * kMiB);
  }
  {
    CudaBackend be(0, 16 * kMiB);  // --workspace-mib 16: kept whatever the weights
    const Tensor w = be.weight(weight_of(qw, wide, rows));
    be.fit_workspace();
    CHECK(be.workspace_bytes() == (16 + 32) * kMiB);
  }
}

TEST_CASE("cuda backend: the tensor pool reuses a released block and keeps sizes apart") {
  if (!xpack::test::gpu::available()) return;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    CudaTensorPool pool(stream);
    // Classes: at most a quarter above the request, multiples of 256, fixed points.
    for (size_t b : {size_t(0), size_t(1), size_t(256), size_t(4095), size_t(4097), size_t(5000), size_t(12345),
                     size_t(1) << 20, (size_t(1) << 20) + 1, CudaTensorPool::kMaxPooledBytes,
                     CudaTensorPool::kMaxPooledBytes + 1}) {
      CAPTURE(b);
      const size_t c = CudaTensorPool::class_bytes(b);
      CHECK(c >= std::max<size_t>(b, 1));
      CHECK(c % 256 == 0);
      CHECK(CudaTensorPool::class_bytes(c) == c);
      if (b > 4096) CHECK(double(c) <= 1.25 * double(b) + 256);
    }
    cudaError_t e = cudaSuccess;
    void* a = pool.acquire(5000, &e);
    REQUIRE(a != nullptr);
    CHECK(e == cudaSuccess);
    pool.release(a, 5000);
    CHECK(pool.cached_bytes() == CudaTensorPool::class_bytes(5000));
    void* b = pool.acquire(5100, &e);  // the same class
    CHECK(b == a);
    CHECK(pool.cached_bytes() == 0);
    void* c = pool.acquire(100000, &e);  // another class: a block of its own
    REQUIRE(c != nullptr);
    CHECK(c != a);
    // Work enqueued after a release may use the block at once: stream order.
    std::vector<float> host(1250, 1.0f), back(1250, 0.0f);
    REQUIRE(cudaMemcpyAsync(b, host.data(), 5000, cudaMemcpyHostToDevice, stream) == cudaSuccess);
    pool.release(b, 5100);
    void* again = pool.acquire(5000, &e);
    CHECK(again == a);
    REQUIRE(cudaMemcpyAsync(back.data(), again, 5000, cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(back == host);
    pool.release(again, 5000);
    pool.release(c, 100000);
    // Beyond the pooled sizes a block goes straight back.
    void* big = pool.acquire(CudaTensorPool::kMaxPooledBytes + 1, &e);
    REQUIRE(big != nullptr);
    pool.release(big, CudaTensorPool::kMaxPooledBytes + 1);
    CHECK(pool.cached_bytes() == CudaTensorPool::class_bytes(5000) + CudaTensorPool::class_bytes(100000));
    pool.trim();
    CHECK(pool.cached_bytes() == 0);
    // A request the device cannot hold fails with the error, nothing thrown.
    void* huge = pool.acquire(size_t(1) << 50, &e);
    CHECK(huge == nullptr);
    CHECK(e == cudaErrorMemoryAllocation);
  }
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST_CASE("cuda backend: RoPE (normal, tail, YaRN, inverse, position step), norm + RoPE, grouped-query causal attention") {
  if (!xpack::test::gpu::available()) return;
  Backends be;
  const int64_t head = 32, n_head = 4, n = 6;
  RopeSpec plain;
  plain.angles.n_dims = 16;
  plain.head_dim = head;
  RopeSpec yarn = plain;
  yarn.tail = true;
  yarn.angles.freq_base = 50000.0f;
  yarn.angles.freq_scale = 0.25f;
  yarn.angles.ext_factor = 1.0f;
  yarn.angles.attn_factor = 1.1f;
  yarn.angles.beta_fast = 32.0f;
  yarn.angles.beta_slow = 1.0f;
  yarn.angles.n_ctx_orig = 4096;
  const std::vector<float> xv = random_floats(size_t(head * n_head * n), 11);
  for (const RopeSpec* spec : {&plain, &yarn}) {
    for (bool inverse : {false, true}) {
      Both x = be.up(xv, head * n_head);
      be.cpu.rope(x.cpu, *spec, 3000, 2, inverse);
      be.gpu.rope(x.gpu, *spec, 3000, 2, inverse);
      be.same(x, 1e-5, spec->tail ? "rope tail YaRN" : "rope normal");
    }
  }
  // The norm of each head and its rotation in one launch against the CPU's rms_norm then
  // rope: 4 heads without a weight, one head with one (DeepSeek-V4's queries and key).
  for (const RopeSpec* spec : {&plain, &yarn}) {
    Both x = be.up(xv, head * n_head);
    be.cpu.rms_norm_rope(x.cpu, nullptr, 1e-6f, *spec, 3000);
    be.gpu.rms_norm_rope(x.gpu, nullptr, 1e-6f, *spec, 3000);
    be.same(x, 1e-5, spec->tail ? "rms_norm_rope tail YaRN" : "rms_norm_rope normal");
    const Both w = be.up(random_floats(size_t(head), 15), head);
    Both one = be.up(std::vector<float>(xv.begin(), xv.begin() + head * n), head);
    be.cpu.rms_norm_rope(one.cpu, &w.cpu, 1e-6f, *spec, 7);
    be.gpu.rms_norm_rope(one.gpu, &w.gpu, 1e-6f, *spec, 7);
    be.same(one, 1e-5, "rms_norm_rope with a weight");
  }
  Both odd = be.up(xv, head * n_head);
  CHECK_THROWS_AS(be.gpu.rms_norm_rope(odd.gpu, nullptr, 1e-6f, [&] {
    RopeSpec s = plain;
    s.head_dim = 24;  // 128 is not whole heads of 24
    return s;
  }(), 0), ModelError);

  // 4 query heads over 2 KV heads, 6 new positions after 5 cached ones.
  const int64_t n_kv = 2, pos0 = 5;
  const Both qq = be.up(random_floats(size_t(head * n_head * n), 12), head * n_head);
  const Both kk = be.up(random_floats(size_t(head * n_kv * (pos0 + n)), 13), head * n_kv);
  const Both vv = be.up(random_floats(size_t(head * n_kv * (pos0 + n)), 14), head * n_kv);
  Both out = be.alloc(XPACK_TYPE_F32, head * n_head, n);
  be.cpu.attention(qq.cpu, kk.cpu, vv.cpu, n_head, n_kv, pos0, 0.177f, out.cpu);
  be.gpu.attention(qq.gpu, kk.gpu, vv.gpu, n_head, n_kv, pos0, 0.177f, out.gpu);
  be.same(out, 1e-5, "attention");
}

TEST_CASE("cuda backend: matmul and grouped_matmul (each expert's rows = its matmul alone, bit for bit); scatter and sum") {
  if (!xpack::test::gpu::available()) return;
  Backends be;
  const int64_t ne0 = 256, ne1 = 48;
  std::vector<Both> ws;
  for (uint32_t e = 0; e < 3; ++e) {
    const std::vector<uint8_t> q = q8_0_rows(ne0, ne1, 20 + e);
    ws.push_back(be.up(XPACK_TYPE_Q8_0, q.data(), ne0, ne1));
  }
  // Experts with 2, 1 and 3 rows of a 6-row batch.
  const Both x = be.up(random_floats(size_t(ne0 * 6), 21), ne0);
  const int64_t first[3] = {0, 2, 3}, count[3] = {2, 1, 3};
  std::vector<Backend::GroupedProblem> pc, pg;
  for (int e = 0; e < 3; ++e) {
    pc.push_back({ws[size_t(e)].cpu, first[e], count[e]});
    pg.push_back({ws[size_t(e)].gpu, first[e], count[e]});
  }
  Both grouped = be.alloc(XPACK_TYPE_F32, ne1, 6);
  be.cpu.grouped_matmul(pc, x.cpu, grouped.cpu);
  be.gpu.grouped_matmul(pg, x.gpu, grouped.gpu);
  be.same(grouped, 1e-5, "grouped_matmul Q8_0");
  Both alone = be.alloc(XPACK_TYPE_F32, ne1, 6);
  for (int e = 0; e < 3; ++e)
    be.gpu.matmul(ws[size_t(e)].gpu, x.gpu.row_range(first[e], count[e]), alone.gpu.row_range(first[e], count[e]));
  std::vector<float> a(size_t(ne1 * 6)), b(size_t(ne1 * 6));
  be.gpu.download(grouped.gpu, a.data());
  be.gpu.download(alone.gpu, b.data());
  CHECK(a == b);
  // Weights of different types in one group are refused.
  std::vector<float> fw = random_floats(size_t(ne0 * ne1), 22);
  const Both f32w = be.up(fw, ne0);
  std::vector<Backend::GroupedProblem> mixed = {{ws[0].gpu, 0, 2}, {f32w.gpu, 2, 1}};
  CHECK_THROWS_AS(be.gpu.grouped_matmul(mixed, x.gpu, grouped.gpu), ModelError);

  // Products of one input: three Q8_0 weights and one F32, each output its matmul
  // alone, bit for bit, at 1 and 6 tokens (shared launches: the backend's products
  // that are not experts take the decode kernel up to 8 where they have at most
  // 4096 rows; the 4100-row one, which keeps the tensor cores from 5 tokens, in a
  // call of its own) and at 12 (matmul each, on the tensor cores); the CPU's within
  // the fp32 bound of a dot product (dot_bound: 2026-12-06 on an H100, 4100 rows
  // were 1.5e-5 of 1 + |y| from it, past the 1e-5 that 48 rows had kept); a shape
  // that disagrees is refused.
  const int64_t tall = 4100;
  const std::vector<uint8_t> qt = q8_0_rows(ne0, tall, 26);
  const Both tallw = be.up(XPACK_TYPE_Q8_0, qt.data(), ne0, tall);
  for (const int64_t n : {int64_t(1), int64_t(6), int64_t(12)}) {
    CAPTURE(n);
    const std::vector<float> xh = random_floats(size_t(ne0 * n), 25 + uint32_t(n));
    const Both xs = be.up(xh, ne0);
    const std::vector<float> wvals[4] = {q8_0_values(q8_0_rows(ne0, ne1, 20)), q8_0_values(qt), fw,
                                         q8_0_values(q8_0_rows(ne0, ne1, 22))};
    const Both* wsel[4] = {&ws[0], &tallw, &f32w, &ws[2]};
    const int64_t rows_of[4] = {ne1, tall, ne1, ne1};
    Both shared[4] = {be.alloc(XPACK_TYPE_F32, rows_of[0], n), be.alloc(XPACK_TYPE_F32, rows_of[1], n),
                      be.alloc(XPACK_TYPE_F32, rows_of[2], n), be.alloc(XPACK_TYPE_F32, rows_of[3], n)};
    std::vector<Backend::Product> pcpu, pgpu;
    for (int i = 0; i < 4; ++i) {
      pcpu.push_back({&wsel[i]->cpu, &shared[i].cpu});
      pgpu.push_back({&wsel[i]->gpu, &shared[i].gpu});
    }
    be.cpu.shared_input_matmul(xs.cpu, pcpu);
    be.gpu.shared_input_matmul(xs.gpu, pgpu);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      be.within(shared[i], dot_bound(wvals[i], rows_of[i], xh, ne0), "shared_input_matmul");
      Both one = be.alloc(XPACK_TYPE_F32, rows_of[i], n);
      be.gpu.matmul(wsel[i]->gpu, xs.gpu, one.gpu);
      std::vector<float> sa(size_t(rows_of[i] * n)), sb(size_t(rows_of[i] * n));
      be.gpu.download(shared[i].gpu, sa.data());
      be.gpu.download(one.gpu, sb.data());
      CHECK(std::memcmp(sa.data(), sb.data(), sa.size() * 4) == 0);
    }
    const Both narrow = be.alloc(XPACK_TYPE_F32, ne1 - 1, n);
    std::vector<Backend::Product> wrong = {{&ws[0].gpu, &shared[0].gpu}, {&ws[1].gpu, &narrow.gpu}};
    CHECK_THROWS_AS(be.gpu.shared_input_matmul(xs.gpu, wrong), ModelError);
  }

  // The dispatcher's rank-order combine: 3 tokens x k = 2 picks over 6 rows out of order.
  const int64_t d = 40, k = 2;
  const Both ys = be.up(random_floats(size_t(d * 6), 23), d);
  const std::vector<int32_t> rows = {4, 1, 0, 5, 2, 3};
  const Both rw = be.up(rows, 1);
  const Both wts = be.up(random_floats(size_t(6), 24), k);
  const std::vector<float> base = random_floats(size_t(d * 3), 25);
  for (bool acc : {false, true}) {
    Both sum = be.up(base, d);
    be.cpu.combine_picks(ys.cpu, rw.cpu, wts.cpu, k, acc, sum.cpu);
    be.gpu.combine_picks(ys.gpu, rw.gpu, wts.gpu, k, acc, sum.gpu);
    be.same(sum, 0.0, acc ? "combine_picks accumulate" : "combine_picks");
  }
}
