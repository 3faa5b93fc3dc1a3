// deepseek4's own operations (models/deepseek4/ds4_ops.h) on CUDA against their
// CPU versions, op by op on random tensors, including what the oracle models
// never reach: hc_mult 1..8 and 1 or 20 Sinkhorn passes, pooling windows that
// start mid-sequence, an indexer over thousands of blocks with exact score ties
// (the choice must be the CPU's, index for index), attention whose scores do not
// fit in shared memory (the scratch path), -1 padded choices, a prompt's
// attention as batched products over chunks of queries; and the refusals
// (hc_mult 9, a pooled row already dropped, a query without its own key).
// Without a CUDA device every case is skipped (exit 77).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "gpu_available.h"
#include "models/deepseek4/ds4_ops.h"
#include "skip.h"
#include "xpack/xpack.h"

using namespace xrun;
using namespace xrun::ds4;

namespace {

constexpr uint32_t kF32 = XPACK_TYPE_F32, kI32 = XPACK_TYPE_I32;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// The same host data on both backends, their ops, and comparisons of results.
struct Pair {
  CpuBackend cpu{2};
  CudaBackend gpu{0};
  std::unique_ptr<Ds4Ops> cops = make_ds4_ops(cpu), gops = make_ds4_ops(gpu);

  struct T {
    Tensor c, g;
  };
  T f32(const std::vector<float>& v, int64_t width, int64_t rows = 1) {
    return {cpu.upload(kF32, v.data(), width, rows), gpu.upload(kF32, v.data(), width, rows)};
  }
  T i32(const std::vector<int32_t>& v, int64_t width, int64_t rows = 1) {
    return {cpu.upload(kI32, v.data(), width, rows), gpu.upload(kI32, v.data(), width, rows)};
  }
  T zeros(uint32_t type, int64_t width, int64_t rows = 1) { return {cpu.alloc(type, width, rows), gpu.alloc(type, width, rows)}; }

  template <class V>
  std::pair<std::vector<V>, std::vector<V>> get(const T& t) {
    std::vector<V> c(size_t(t.c.numel())), g(size_t(t.g.numel()));
    cpu.download(t.c, c.data());
    gpu.download(t.g, g.data());
    return {c, g};
  }
  // max |gpu - cpu| / (1 + max |cpu|): both finite.
  double rel_diff(const T& t) {
    auto [c, g] = get<float>(t);
    double d = 0, m = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      REQUIRE(std::isfinite(c[i]));
      REQUIRE(std::isfinite(g[i]));
      d = std::max(d, std::fabs(double(g[i]) - c[i]));
      m = std::max(m, std::fabs(double(c[i])));
    }
    return d / (1.0 + m);
  }
};

}  // namespace

TEST_CASE("ds4 ops on CUDA: hc_pre and hc_head with a norm folded in agree with the CPU, call after call") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t hc = 4, iters = 20, md = (2 + hc) * hc;
  // One block of a token, four with a partial last one, sixteen (DeepSeek-V4's
  // 4096); 70 tokens outgrow the first buffers of the blocks' sums.
  for (int64_t d : {67, 1000, 4096}) {
    for (int64_t n : {1, 5, 70}) {
      CAPTURE(d);
      CAPTURE(n);
      const HcShape s{hc, d, iters, 1e-6f, 1e-6f};
      auto mixes = p.f32(random_floats(size_t(n * md), 11, 3.0f), md, n);
      auto base = p.f32(random_floats(size_t(md), 12), md);
      auto scale = p.f32({0.7f, -1.3f, 2.1f}, 3);
      auto stream = p.f32(random_floats(size_t(n * hc * d), 13, 4.0f), hc * d, n);
      auto norm = p.f32(random_floats(size_t(d), 14), d);
      auto input = p.zeros(kF32, d, n), post = p.zeros(kF32, hc, n), comb = p.zeros(kF32, hc * hc, n);
      p.cops->hc_pre(s, mixes.c, base.c, scale.c, stream.c, input.c, post.c, comb.c, &norm.c);
      p.gops->hc_pre(s, mixes.g, base.g, scale.g, stream.g, input.g, post.g, comb.g, &norm.g);
      CHECK(p.rel_diff(input) <= 1e-5);
      CHECK(p.rel_diff(post) <= 1e-6);
      const std::vector<float> first = p.get<float>(input).second;
      // Again on the same buffers: the blocks' counters were left at zero.
      p.gops->hc_pre(s, mixes.g, base.g, scale.g, stream.g, input.g, post.g, comb.g, &norm.g);
      CHECK(p.get<float>(input).second == first);
      // The unfolded pair on the GPU: the same values up to the sum's order.
      auto plain = p.zeros(kF32, d, n);
      p.gops->hc_pre(s, mixes.g, base.g, scale.g, stream.g, plain.g, post.g, comb.g);
      p.gpu.rms_norm(plain.g, &norm.g, s.rms_eps, plain.g);
      const std::vector<float> two = p.get<float>(plain).second;
      double worst = 0;
      for (size_t i = 0; i < two.size(); ++i) worst = std::max(worst, std::fabs(double(two[i]) - first[i]));
      CHECK(worst <= 1e-5);
      // The head's collapse through output_norm, folded the same way.
      auto head_mix = p.f32(random_floats(size_t(n * hc), 19, 2.0f), hc, n);
      auto head_base = p.f32(random_floats(size_t(hc), 20), hc);
      auto head_scale = p.f32({1.7f}, 1);
      auto head = p.zeros(kF32, d, n);
      p.cops->hc_head(s, head_mix.c, head_base.c, head_scale.c, stream.c, head.c, &norm.c);
      p.gops->hc_head(s, head_mix.g, head_base.g, head_scale.g, stream.g, head.g, &norm.g);
      CHECK(p.rel_diff(head) <= 1e-5);
    }
  }
  // A norm of the wrong width is refused.
  const HcShape s{hc, 67, iters, 1e-6f, 1e-6f};
  auto mixes = p.f32(random_floats(size_t(md), 15), md, 1);
  auto base = p.f32(random_floats(size_t(md), 16), md);
  auto scale = p.f32({0.7f, -1.3f, 2.1f}, 3);
  auto stream = p.f32(random_floats(size_t(hc * 67), 17), hc * 67, 1);
  auto wrong = p.f32(random_floats(66, 18), 66);
  auto input = p.zeros(kF32, 67, 1), post = p.zeros(kF32, hc, 1), comb = p.zeros(kF32, hc * hc, 1);
  CHECK_THROWS_AS(p.gops->hc_pre(s, mixes.g, base.g, scale.g, stream.g, input.g, post.g, comb.g, &wrong.g), ModelError);
}

TEST_CASE("ds4 ops on CUDA: hyper-connections (hc 1..8, 1 and 20 Sinkhorn passes) agree with the CPU") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t n = 5, d = 67;  // an odd width: no vector alignment to lean on
  // Up to 5 copies the Sinkhorn runs in one warp's registers, from 6 in shared memory.
  for (int64_t hc : {1, 3, 4, 5, 6, 8}) {
    for (int64_t iters : {1, 20}) {
      CAPTURE(hc);
      CAPTURE(iters);
      const HcShape s{hc, d, iters, 1e-6f, 1e-6f};
      const int64_t md = (2 + hc) * hc;
      auto mixes = p.f32(random_floats(size_t(n * md), 1, 3.0f), md, n);
      auto base = p.f32(random_floats(size_t(md), 2), md);
      auto scale = p.f32({0.7f, -1.3f, 2.1f}, 3);
      auto stream = p.f32(random_floats(size_t(n * hc * d), 3), hc * d, n);
      auto input = p.zeros(kF32, d, n), post = p.zeros(kF32, hc, n), comb = p.zeros(kF32, hc * hc, n);
      p.cops->hc_pre(s, mixes.c, base.c, scale.c, stream.c, input.c, post.c, comb.c);
      p.gops->hc_pre(s, mixes.g, base.g, scale.g, stream.g, input.g, post.g, comb.g);
      CHECK(p.rel_diff(input) <= 1e-5);
      CHECK(p.rel_diff(post) <= 1e-6);
      CHECK(p.rel_diff(comb) <= 1e-5);
      // Doubly stochastic after 20 passes: every column sums to ~1 (the last step normalises columns).
      if (iters == 20 && hc > 1) {
        const auto c = p.get<float>(comb).second;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t dst = 0; dst < hc; ++dst) {
            double col = 0;
            for (int64_t src = 0; src < hc; ++src) col += c[size_t(t * hc * hc + src * hc + dst)];
            CHECK(std::fabs(col - 1.0) <= 1e-4);
          }
      }

      auto output = p.f32(random_floats(size_t(n * d), 4), d, n);
      auto out_stream = p.zeros(kF32, hc * d, n);
      p.cops->hc_post(s, output.c, stream.c, post.c, comb.c, out_stream.c);
      p.gops->hc_post(s, output.g, stream.g, post.g, comb.g, out_stream.g);
      CHECK(p.rel_diff(out_stream) <= 1e-5);

      auto head_mix = p.f32(random_floats(size_t(n * hc), 5, 2.0f), hc, n);
      auto head_base = p.f32(random_floats(size_t(hc), 6), hc);
      auto head_scale = p.f32({1.7f}, 1);
      auto head = p.zeros(kF32, d, n);
      p.cops->hc_head(s, head_mix.c, head_base.c, head_scale.c, stream.c, head.c);
      p.gops->hc_head(s, head_mix.g, head_base.g, head_scale.g, stream.g, head.g);
      CHECK(p.rel_diff(head) <= 1e-5);
    }
  }
  // More copies than the kernels hold: refused, naming the limit.
  const HcShape s9{9, d, 20, 1e-6f, 1e-6f};
  auto mixes = p.f32(random_floats(size_t(n * 99), 1), 99, n);
  auto base = p.f32(random_floats(99, 2), 99);
  auto scale = p.f32({1, 1, 1}, 3);
  auto stream = p.f32(random_floats(size_t(n * 9 * d), 3), 9 * d, n);
  auto input = p.zeros(kF32, d, n), post = p.zeros(kF32, 9, n), comb = p.zeros(kF32, 81, n);
  CHECK_THROWS_WITH_AS(p.gops->hc_pre(s9, mixes.g, base.g, scale.g, stream.g, input.g, post.g, comb.g),
                       doctest::Contains("at most 8 copies"), ModelError);
  // Shapes that disagree are refused as on the CPU.
  const HcShape s4{4, d, 20, 1e-6f, 1e-6f};
  CHECK_THROWS_AS(p.gops->hc_pre(s4, mixes.g, base.g, scale.g, stream.g, input.g, post.g, comb.g), ModelError);
}

TEST_CASE("ds4 ops on CUDA: compress_pool (4:1 overlapping, 128:1, windows starting mid-sequence)") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  struct Case {
    int64_t ratio, width, rows_first, first_block, n_out;
    bool overlap;
  } cases[] = {
      {4, 24, 0, 0, 5, true},    // block 0 pools nothing of a previous block
      {4, 24, 12, 4, 3, true},   // rows from position 12 = block 3, the previous block of block 4
      {128, 16, 0, 0, 2, false},
      {128, 16, 128, 1, 1, false},
      {1, 8, 0, 0, 7, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.ratio);
    CAPTURE(c.rows_first);
    const int64_t rw = c.overlap ? 2 * c.width : c.width;
    const int64_t rows = (c.first_block + c.n_out) * c.ratio - c.rows_first;
    auto kv = p.f32(random_floats(size_t(rows * rw), 7), rw, rows);
    auto score = p.f32(random_floats(size_t(rows * rw), 8, 4.0f), rw, rows);
    auto out = p.zeros(kF32, c.width, c.n_out);
    p.cops->compress_pool(kv.c, score.c, c.rows_first, c.first_block, c.ratio, c.overlap, out.c);
    p.gops->compress_pool(kv.g, score.g, c.rows_first, c.first_block, c.ratio, c.overlap, out.g);
    CHECK(p.rel_diff(out) <= 1e-5);
  }
  // Block 2 pools positions 4..11; with rows kept from position 8 on, the first
  // half is gone (refused on both), and so are positions past the kept rows.
  auto kv = p.f32(random_floats(8 * 48, 7), 48, 8);
  auto out = p.zeros(kF32, 24, 1);
  CHECK_THROWS_AS(p.gops->compress_pool(kv.g, kv.g, 8, 2, 4, true, out.g), ModelError);
  CHECK_THROWS_AS(p.cops->compress_pool(kv.c, kv.c, 8, 2, 4, true, out.c), ModelError);
  CHECK_THROWS_AS(p.gops->compress_pool(kv.g, kv.g, 4, 3, 4, true, out.g), ModelError);
  CHECK_THROWS_AS(p.cops->compress_pool(kv.c, kv.c, 4, 3, 4, true, out.c), ModelError);
}

TEST_CASE("ds4 ops on CUDA: indexer_select is the CPU's choice, ties included, over thousands of blocks") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t n_head = 6, id = 32, ratio = 4, top_k = 64, n_blocks = 3000, n = 4;
  std::vector<float> keys = random_floats(size_t(n_blocks * id), 9);
  // Exact ties: every 7th block repeats block 0 (equal scores, the lower index must win).
  for (int64_t b = 7; b < n_blocks; b += 7) std::copy_n(keys.begin(), id, keys.begin() + b * id);
  auto k = p.f32(keys, id, n_blocks);
  auto q = p.f32(random_floats(size_t(n * n_head * id), 10), n_head * id, n);
  auto w = p.f32(random_floats(size_t(n * n_head), 11), n_head, n);
  // Queries at positions around 4 * n_blocks: the last sees every block; one at
  // the start sees fewer than top_k (no scoring, all visible, -1 padded).
  for (int64_t pos0 : {int64_t(4 * n_blocks - n), int64_t(4 * 40), int64_t(1000)}) {
    CAPTURE(pos0);
    auto chosen = p.zeros(kI32, top_k, n);
    p.cops->indexer_select(q.c, w.c, k.c, n_head, pos0, ratio, chosen.c);
    p.gops->indexer_select(q.g, w.g, k.g, n_head, pos0, ratio, chosen.g);
    auto [c, g] = p.get<int32_t>(chosen);
    CHECK(c == g);
    // Ascending block ids, then the -1 padding (only where fewer than top_k are visible).
    const auto valid_end = std::find(g.begin(), g.begin() + top_k, -1);
    CHECK(std::is_sorted(g.begin(), valid_end));
    CHECK(std::all_of(valid_end, g.begin() + top_k, [](int32_t b) { return b == -1; }));
    CHECK((valid_end == g.begin() + top_k) == (pos0 + 1 >= ratio * top_k));
  }
  // Fewer blocks than top_k in all: every query takes all it sees.
  auto few = p.f32(random_floats(size_t(10 * id), 12), id, 10);
  auto chosen = p.zeros(kI32, top_k, n);
  p.cops->indexer_select(q.c, w.c, few.c, n_head, 30, ratio, chosen.c);
  p.gops->indexer_select(q.g, w.g, few.g, n_head, 30, ratio, chosen.g);
  auto [c, g] = p.get<int32_t>(chosen);
  CHECK(c == g);
  // Query 0 at position 30 sees blocks 0..6 (block 7 ends at position 31); query 1 sees block 7 too.
  CHECK(g[6] == 6);
  CHECK(g[7] == -1);
  CHECK(g[size_t(top_k) + 7] == 7);
  CHECK(g[size_t(top_k) + 8] == -1);
}

namespace {

// attention_cpu.cpp's indexer score, expression for expression (float dot in
// index order, relu times w in float, heads summed in double in order): only to
// decide where the test puts its ties, the CPU op stays the reference.
std::vector<float> host_scores(const std::vector<float>& keys, int64_t n_vis, const float* q, const float* w,
                               int64_t n_head, int64_t id) {
  std::vector<float> s(static_cast<size_t>(n_vis));
  for (int64_t b = 0; b < n_vis; ++b) {
    double acc = 0.0;
    for (int64_t h = 0; h < n_head; ++h) {
      float d = 0.0f;
      for (int64_t i = 0; i < id; ++i) d += q[h * id + i] * keys[size_t(b * id + i)];
      acc += static_cast<double>(std::max(0.0f, d) * w[h]);
    }
    s[size_t(b)] = static_cast<float>(acc);
  }
  return s;
}

// Blocks by (score descending, index ascending): the CPU's order.
std::vector<int64_t> ranked(const std::vector<float>& s) {
  std::vector<int64_t> order(s.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  return order;
}

// Makes the top_k-th block of the query (q, w) share its key with 5 blocks
// ranked above it and 15 ranked below, spread over the index range: 21 blocks
// then tie on the last chosen score, of which only the 6 lowest indices may be
// chosen.
void tie_at_boundary(std::vector<float>& keys, int64_t n_vis, int64_t top_k, const float* q, const float* w,
                     int64_t n_head, int64_t id) {
  const std::vector<int64_t> order = ranked(host_scores(keys, n_vis, q, w, n_head, id));
  const int64_t star = order[size_t(top_k - 1)];
  std::vector<int64_t> copies;
  for (int64_t j = 0; j < 5; ++j) copies.push_back(order[size_t(j * (top_k - 1) / 5)]);
  for (int64_t j = 0; j < 15; ++j) copies.push_back(order[size_t(top_k + j * (n_vis - top_k) / 15)]);
  for (int64_t b : copies) std::copy_n(keys.begin() + star * id, id, keys.begin() + b * id);
}

// The blocks whose score equals the top_k-th: `chosen` (one query's row) takes
// some of them but not all, and those it takes are their lowest indices.
void check_boundary_tie(const std::vector<float>& keys, int64_t n_vis, int64_t top_k, const float* q, const float* w,
                        int64_t n_head, int64_t id, const int32_t* chosen) {
  const std::vector<float> s = host_scores(keys, n_vis, q, w, n_head, id);
  const float last = s[size_t(ranked(s)[size_t(top_k - 1)])];
  std::vector<int64_t> group, taken;
  for (int64_t b = 0; b < n_vis; ++b)
    if (s[size_t(b)] == last) group.push_back(b);
  for (int64_t j = 0; j < top_k; ++j)
    if (chosen[j] >= 0 && s[size_t(chosen[j])] == last) taken.push_back(chosen[j]);
  CAPTURE(group.size());
  CHECK(!taken.empty());
  CHECK(taken.size() < group.size());
  CHECK(std::equal(taken.begin(), taken.end(), group.begin()));
}

}  // namespace

// DeepSeek-V4-Flash's indexer shape (64 heads of 128, top_k 512, ratio 4): one
// query over 1024 and over 20000 visible blocks (decode at 4K and 80K of
// context), and 64 queries whose positions span top_k * ratio (the first take
// every block they see, the last choose). Besides repeated keys, each single
// query gets a tie on its last chosen score, cut by the lower index.
TEST_CASE("ds4 ops on CUDA: indexer_select at DeepSeek-V4-Flash's shape is the CPU's choice, boundary ties included") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t n_head = 64, id = 128, ratio = 4, top_k = 512;
  const std::vector<float> qv = random_floats(size_t(64 * n_head * id), 31), wv = random_floats(size_t(64 * n_head), 32);
  auto q = p.f32(qv, n_head * id, 64);
  auto w = p.f32(wv, n_head, 64);
  for (int64_t n_blocks : {int64_t(1024), int64_t(20000)}) {
    CAPTURE(n_blocks);
    std::vector<float> keys = random_floats(size_t(n_blocks * id), uint32_t(33 + n_blocks));
    for (int64_t b = 11; b < n_blocks; b += 11) std::copy_n(keys.begin() + 3 * id, id, keys.begin() + b * id);
    tie_at_boundary(keys, n_blocks, top_k, qv.data(), wv.data(), n_head, id);
    auto k = p.f32(keys, id, n_blocks);
    // One query (row 0 of q and w) that sees every block.
    const Tensor q1c = q.c.row_range(0, 1), q1g = q.g.row_range(0, 1), w1c = w.c.row_range(0, 1),
                 w1g = w.g.row_range(0, 1);
    auto chosen = p.zeros(kI32, top_k, 1);
    p.cops->indexer_select(q1c, w1c, k.c, n_head, ratio * n_blocks - 1, ratio, chosen.c);
    p.gops->indexer_select(q1g, w1g, k.g, n_head, ratio * n_blocks - 1, ratio, chosen.g);
    auto [c, g] = p.get<int32_t>(chosen);
    CHECK(c == g);
    CHECK(std::is_sorted(g.begin(), g.end()));
    CHECK(g.front() >= 0);
    check_boundary_tie(keys, n_blocks, top_k, qv.data(), wv.data(), n_head, id, g.data());
    if (n_blocks != 20000) continue;
    // 64 queries at positions 2015..2078: 503 to 519 visible blocks.
    const int64_t n = 64, pos0 = ratio * top_k - 33;
    auto batch = p.zeros(kI32, top_k, n);
    p.cops->indexer_select(q.c, w.c, k.c, n_head, pos0, ratio, batch.c);
    p.gops->indexer_select(q.g, w.g, k.g, n_head, pos0, ratio, batch.g);
    auto [bc, bg] = p.get<int32_t>(batch);
    CHECK(bc == bg);
    for (int64_t t = 0; t < n; ++t) {
      CAPTURE(t);
      const auto row = bg.begin() + t * top_k;
      const auto valid_end = std::find(row, row + top_k, -1);
      CHECK(valid_end - row == std::min<int64_t>(top_k, (pos0 + t + 1) / ratio));
      CHECK(std::is_sorted(row, valid_end));
      CHECK(std::all_of(valid_end, row + top_k, [](int32_t b) { return b == -1; }));
    }
  }
}

// Shapes off the kernels' tiles: 70 heads (two head chunks), a head dimension
// of 40 (a partial chunk), blocks not a multiple of the tile, and top_k 1 (the
// choice is the single best block, its lowest index on ties).
TEST_CASE("ds4 ops on CUDA: indexer_select off the tile sizes (70 heads of 40, top_k 100 and 1) is the CPU's choice") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t n_head = 70, id = 40, ratio = 4, n_blocks = 701, n = 3;
  std::vector<float> keys = random_floats(size_t(n_blocks * id), 41);
  for (int64_t b = 5; b < n_blocks; b += 5) std::copy_n(keys.begin() + 2 * id, id, keys.begin() + b * id);
  auto k = p.f32(keys, id, n_blocks);
  auto q = p.f32(random_floats(size_t(n * n_head * id), 42), n_head * id, n);
  auto w = p.f32(random_floats(size_t(n * n_head), 43), n_head, n);
  for (int64_t top_k : {int64_t(100), int64_t(1)}) {
    CAPTURE(top_k);
    auto chosen = p.zeros(kI32, top_k, n);
    p.cops->indexer_select(q.c, w.c, k.c, n_head, 2798, ratio, chosen.c);  // 699, 700 and 700 visible
    p.gops->indexer_select(q.g, w.g, k.g, n_head, 2798, ratio, chosen.g);
    auto [c, g] = p.get<int32_t>(chosen);
    CHECK(c == g);
    CHECK(std::none_of(g.begin(), g.end(), [](int32_t b) { return b < 0; }));
  }
}

TEST_CASE("ds4 ops on CUDA: attention with sinks over window, all blocks, chosen blocks and the scratch path") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t nh = 4, hd = 40, window = 6, ratio = 4, n = 5;
  const int64_t pos0 = 20000 * ratio;  // 20000 visible blocks: 80 KB of scores, more than shared memory holds
  const int64_t raw_first = pos0 - window + 1, raw_rows = n + window - 1;
  auto q = p.f32(random_floats(size_t(n * nh * hd), 13, 0.5f), nh * hd, n);
  auto raw = p.f32(random_floats(size_t(raw_rows * hd), 14), hd, raw_rows);
  auto sinks = p.f32({0.5f, -2.0f, 3.0f, 0.0f}, nh);
  for (int64_t n_blocks : {int64_t(0), int64_t(37), int64_t(20001)}) {
    CAPTURE(n_blocks);
    auto blocks = p.f32(random_floats(size_t(std::max<int64_t>(1, n_blocks) * hd), 15), hd, std::max<int64_t>(1, n_blocks));
    const Tensor bc = blocks.c.row_range(0, n_blocks), bg = blocks.g.row_range(0, n_blocks);
    auto out = p.zeros(kF32, nh * hd, n);
    p.cops->attention(q.c, raw.c, raw_first, window, n_blocks ? &bc : nullptr, ratio, nullptr, sinks.c, pos0, out.c);
    p.gops->attention(q.g, raw.g, raw_first, window, n_blocks ? &bg : nullptr, ratio, nullptr, sinks.g, pos0, out.g);
    CHECK(p.rel_diff(out) <= 1e-5);
  }
  // Chosen blocks, -1 padded differently per query.
  const int64_t m = 9, n_blocks = 50;
  auto blocks = p.f32(random_floats(size_t(n_blocks * hd), 16), hd, n_blocks);
  std::vector<int32_t> ch(size_t(n * m), -1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < m - t; ++j) ch[size_t(t * m + j)] = int32_t(3 * j + t);
  auto chosen = p.i32(ch, m, n);
  auto out = p.zeros(kF32, nh * hd, n);
  p.cops->attention(q.c, raw.c, raw_first, window, &blocks.c, ratio, &chosen.c, sinks.c, pos0, out.c);
  p.gops->attention(q.g, raw.g, raw_first, window, &blocks.g, ratio, &chosen.g, sinks.g, pos0, out.g);
  CHECK(p.rel_diff(out) <= 1e-5);
  // A query whose own key is not among the raw rows is refused.
  CHECK_THROWS_AS(p.gops->attention(q.g, raw.g.row_range(0, raw_rows - 1), raw_first, window, nullptr, ratio, nullptr,
                                    sinks.g, pos0, out.g),
                  ModelError);
}

TEST_CASE("ds4 ops on CUDA: a decode step's attention with its keys split over blocks (DeepSeek-V4's dims)") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t nh = 64, hd = 512, window = 128, ratio = 4, n_blocks = 700;
  const int64_t pos0 = 2900, raw_first = pos0 - window + 1, raw_rows = window;
  auto raw = p.f32(random_floats(size_t(raw_rows * hd), 80), hd, raw_rows);
  auto blocks = p.f32(random_floats(size_t(n_blocks * hd), 81), hd, n_blocks);
  std::vector<float> sk = random_floats(size_t(nh), 82, 2.0f);
  auto sinks = p.f32(sk, nh);
  for (int64_t n : {int64_t(1), int64_t(2)}) {
    CAPTURE(n);
    const int64_t qp = pos0 - n + 1;  // the last query's own key is the last raw row
    auto q = p.f32(random_floats(size_t(n * nh * hd), 83, 0.1f), nh * hd, n);
    // every visible block (a 128:1 layer's shape), then 512 chosen with holes (a 4:1 layer's)
    auto out = p.zeros(kF32, nh * hd, n);
    p.cops->attention(q.c, raw.c, raw_first, window, &blocks.c, ratio, nullptr, sinks.c, qp, out.c);
    p.gops->attention(q.g, raw.g, raw_first, window, &blocks.g, ratio, nullptr, sinks.g, qp, out.g);
    CHECK(p.rel_diff(out) <= 1e-5);
    std::vector<int32_t> ch(size_t(n * 512));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < 512; ++j) ch[size_t(t * 512 + j)] = j % 9 == 4 ? -1 : int32_t(j + t);
    auto chosen = p.i32(ch, 512, n);
    auto out2 = p.zeros(kF32, nh * hd, n);
    p.cops->attention(q.c, raw.c, raw_first, window, &blocks.c, ratio, &chosen.c, sinks.c, qp, out2.c);
    p.gops->attention(q.g, raw.g, raw_first, window, &blocks.g, ratio, &chosen.g, sinks.g, qp, out2.g);
    CHECK(p.rel_diff(out2) <= 1e-5);
  }
}

TEST_CASE("ds4 ops on CUDA: a prompt's attention as products (window only, all blocks in chunks, chosen blocks)") {
  if (!xpack::test::gpu::available()) return;
  Pair p;
  const int64_t nh = 4, hd = 40, window = 6, ratio = 4;
  const auto sinks = p.f32({0.5f, -2.0f, 3.0f, 0.0f}, nh);
  // 16 tokens take the products; 300 from position 0 (a query's first keys are
  // few) and from far in (20001 visible blocks: the chunks hold 76 queries).
  struct Case {
    int64_t n, pos0, n_blocks;
  } cases[] = {{16, 0, 0}, {300, 0, 37}, {300, 20000 * ratio, 20001}, {40, 9, 0}};
  uint32_t seed = 60;
  for (const Case& c : cases) {
    CAPTURE(c.n);
    CAPTURE(c.pos0);
    CAPTURE(c.n_blocks);
    const int64_t raw_first = std::max<int64_t>(0, c.pos0 - window + 1), raw_rows = c.pos0 + c.n - raw_first;
    auto q = p.f32(random_floats(size_t(c.n * nh * hd), seed++, 0.5f), nh * hd, c.n);
    auto raw = p.f32(random_floats(size_t(raw_rows * hd), seed++), hd, raw_rows);
    const int64_t nb = std::max<int64_t>(1, c.n_blocks);
    auto blocks = p.f32(random_floats(size_t(nb * hd), seed++), hd, nb);
    const Tensor bc = blocks.c.row_range(0, c.n_blocks), bg = blocks.g.row_range(0, c.n_blocks);
    auto out = p.zeros(kF32, nh * hd, c.n);
    p.cops->attention(q.c, raw.c, raw_first, window, c.n_blocks ? &bc : nullptr, ratio, nullptr, sinks.c, c.pos0,
                      out.c);
    p.gops->attention(q.g, raw.g, raw_first, window, c.n_blocks ? &bg : nullptr, ratio, nullptr, sinks.g, c.pos0,
                      out.g);
    CHECK(p.rel_diff(out) <= 1e-5);
  }
  // Chosen blocks, -1 padded at the end for some queries and in the middle for others.
  const int64_t n = 50, m = 45, n_blocks = 200, pos0 = 4 * n_blocks;
  const int64_t raw_first = pos0 - window + 1, raw_rows = n + window - 1;
  auto q = p.f32(random_floats(size_t(n * nh * hd), 70, 0.5f), nh * hd, n);
  auto raw = p.f32(random_floats(size_t(raw_rows * hd), 71), hd, raw_rows);
  auto blocks = p.f32(random_floats(size_t(n_blocks * hd), 72), hd, n_blocks);
  std::vector<int32_t> ch(size_t(n * m), -1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < m - t % 7; ++j) ch[size_t(t * m + j)] = (t % 3 == 0 && j % 5 == 2) ? -1 : int32_t(4 * j + t % 4);
  auto chosen = p.i32(ch, m, n);
  auto out = p.zeros(kF32, nh * hd, n);
  p.cops->attention(q.c, raw.c, raw_first, window, &blocks.c, ratio, &chosen.c, sinks.c, pos0, out.c);
  p.gops->attention(q.g, raw.g, raw_first, window, &blocks.g, ratio, &chosen.g, sinks.g, pos0, out.g);
  CHECK(p.rel_diff(out) <= 1e-5);
}
