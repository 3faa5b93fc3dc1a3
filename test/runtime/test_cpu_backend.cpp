// xpack-run's CPU backend, op by op, against plain double-precision references
// written from each operation's contract in backend.h, and its refusals of shapes
// that do not agree (the end-to-end tests only see whole models); the helpers
// written once over any backend (route's default chain, RowWindow) with it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_backend.h"
#include "dequant.h"
#include "row_window.h"
#include "weights.h"
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

std::vector<float> download(CpuBackend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t, v.data());
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(double(got[i]) - want[i]) <= tol * (1.0 + std::abs(want[i])));
  }
}

// y[t][o] = sum_i w[o][i] * x[t][i] in double.
std::vector<double> reference_matmul(const std::vector<float>& w, const std::vector<float>& x, int64_t ne0,
                                     int64_t ne1, int64_t n) {
  std::vector<double> y(size_t(n * ne1));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < ne1; ++o) {
      double s = 0;
      for (int64_t i = 0; i < ne0; ++i) s += double(w[o * ne0 + i]) * x[t * ne0 + i];
      y[t * ne1 + o] = s;
    }
  return y;
}

}  // namespace

TEST_CASE("cpu backend: matmul over F32 and Q8_0 equals the dequantize-and-dot reference") {
  CpuBackend be(3);
  const int64_t ne0 = 64, ne1 = 7, n = 5;
  auto xs = random_floats(size_t(n * ne0), 1);
  Tensor x = be.upload(XPACK_TYPE_F32, xs.data(), ne0, n);
  Tensor y = be.alloc(XPACK_TYPE_F32, ne1, n);

  auto wf = random_floats(size_t(ne0 * ne1), 2);
  Tensor w = be.upload(XPACK_TYPE_F32, wf.data(), ne0, ne1);
  be.matmul(w, x, y);
  check_close(download(be, y), reference_matmul(wf, xs, ne0, ne1, n), 1e-5);

  // Q8_0: blocks of 32 (an fp16 scale, then 32 int8), random bytes with a sane scale.
  std::mt19937 rng(3);
  std::vector<uint8_t> q(size_t(ne1 * (ne0 / 32) * 34));
  for (size_t b = 0; b < q.size(); b += 34) {
    q[b] = 0x00;
    q[b + 1] = 0x2c;  // fp16 0x2c00 = 0.0625
    for (int k = 0; k < 32; ++k) q[b + 2 + k] = uint8_t(rng());
  }
  Tensor wq = be.upload(XPACK_TYPE_Q8_0, q.data(), ne0, ne1);
  be.matmul(wq, x, y);
  std::vector<float> deq(size_t(ne0 * ne1));
  dequantize(XPACK_TYPE_Q8_0, q.data(), deq.data(), ne0 * ne1);
  check_close(download(be, y), reference_matmul(deq, xs, ne0, ne1, n), 1e-5);

  // Shapes that do not agree are refused, not computed.
  Tensor bad_x = be.alloc(XPACK_TYPE_F32, ne0 + 32, n);
  CHECK_THROWS_AS(be.matmul(w, bad_x, y), ModelError);
  Tensor bad_y = be.alloc(XPACK_TYPE_F32, ne1 + 1, n);
  CHECK_THROWS_AS(be.matmul(w, x, bad_y), ModelError);
}

TEST_CASE("cpu backend: rms_norm, softmax_rows, swiglu, add with a broadcast row") {
  CpuBackend be(2);
  const int64_t w = 33, rows = 4;
  auto xs = random_floats(size_t(w * rows), 4, 3.0f);
  auto gs = random_floats(size_t(w), 5);
  Tensor x = be.upload(XPACK_TYPE_F32, xs.data(), w, rows);
  Tensor g = be.upload(XPACK_TYPE_F32, gs.data(), w, 1);
  Tensor y = be.alloc(XPACK_TYPE_F32, w, rows);

  be.rms_norm(x, &g, 1e-6f, y);
  std::vector<double> want(xs.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < w; ++i) ss += double(xs[r * w + i]) * xs[r * w + i];
    const double inv = 1.0 / std::sqrt(ss / double(w) + 1e-6);
    for (int64_t i = 0; i < w; ++i) want[r * w + i] = xs[r * w + i] * inv * gs[i];
  }
  check_close(download(be, y), want, 1e-5);

  be.copy(x, y);
  be.softmax_rows(y);
  auto sm = download(be, y);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e30, sum = 0;
    for (int64_t i = 0; i < w; ++i) mx = std::max(mx, double(xs[r * w + i]));
    for (int64_t i = 0; i < w; ++i) sum += std::exp(xs[r * w + i] - mx);
    for (int64_t i = 0; i < w; ++i) want[r * w + i] = std::exp(xs[r * w + i] - mx) / sum;
  }
  check_close(sm, want, 1e-5);

  // Clamped SwiGLU: silu(min(gate, limit)) * clamp(up, -limit, limit).
  auto us = random_floats(size_t(w * rows), 6, 3.0f);
  Tensor up = be.upload(XPACK_TYPE_F32, us.data(), w, rows);
  be.swiglu(x, up, 1.5f, y);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double gte = std::min(double(xs[i]), 1.5);
    const double u = std::clamp(double(us[i]), -1.5, 1.5);
    want[i] = gte / (1.0 + std::exp(-gte)) * u;
  }
  check_close(download(be, y), want, 1e-5);

  be.add(x, g, y);  // one row added to every row
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < w; ++i) want[r * w + i] = double(xs[r * w + i]) + gs[i];
  check_close(download(be, y), want, 1e-6);
  Tensor other = be.alloc(XPACK_TYPE_F32, w + 1, rows);
  CHECK_THROWS_AS(be.add(x, other, y), ModelError);
  CHECK_THROWS_AS(be.mul(x, other, y), ModelError);
}

TEST_CASE("cpu backend: top_k takes the largest, ties to the lower index; take and get_rows") {
  CpuBackend be(1);
  const float s[2][6] = {{0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 0.0f}, {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}};
  Tensor scores = be.upload(XPACK_TYPE_F32, s, 6, 2);
  Tensor ids = be.alloc(XPACK_TYPE_I32, 3, 2);
  be.top_k(scores, ids);
  int32_t got[6];
  be.download(ids, got);
  CHECK(std::vector<int32_t>(got, got + 3) == std::vector<int32_t>{4, 1, 2});
  CHECK(std::vector<int32_t>(got + 3, got + 6) == std::vector<int32_t>{0, 1, 2});

  Tensor taken = be.alloc(XPACK_TYPE_F32, 3, 2);
  be.take(scores, ids, taken);
  float t[6];
  be.download(taken, t);
  CHECK(t[0] == 3.0f);
  CHECK(t[1] == 2.0f);
  CHECK(t[5] == 1.0f);

  // get_rows of an F32 table: rows by id, in the order given.
  const float table[3][4] = {{0, 1, 2, 3}, {10, 11, 12, 13}, {20, 21, 22, 23}};
  Tensor tab = be.upload(XPACK_TYPE_F32, table, 4, 3);
  const int32_t pick[3] = {2, 0, 2};
  Tensor p = be.upload(XPACK_TYPE_I32, pick, 3, 1);
  Tensor out = be.alloc(XPACK_TYPE_F32, 4, 3);
  be.get_rows(tab, p, out);
  float o[12];
  be.download(out, o);
  CHECK(o[0] == 20.0f);
  CHECK(o[4] == 0.0f);
  CHECK(o[11] == 23.0f);
}

TEST_CASE("cpu backend: rope then its inverse gives the input back; causal attention") {
  CpuBackend be(2);
  const int64_t head_dim = 8, n_head = 2, n = 3;
  auto xs = random_floats(size_t(n * n_head * head_dim), 7);
  Tensor x = be.upload(XPACK_TYPE_F32, xs.data(), n_head * head_dim, n);
  RopeSpec spec;
  spec.angles.n_dims = int(head_dim);
  spec.head_dim = head_dim;
  Backend& base = be;  // the defaults of rope()'s arguments are the interface's
  base.rope(x, spec, 5);
  auto rotated = download(be, x);
  CHECK(rotated != xs);
  base.rope(x, spec, 5, 1, /*inverse=*/true);
  std::vector<double> want(xs.begin(), xs.end());
  check_close(download(be, x), want, 1e-5);

  // One head, D = 2: the first query sees only the first key (causal).
  const float q[2][2] = {{1, 0}, {0, 1}};
  const float k[2][2] = {{1, 0}, {0, 1}};
  const float v[2][2] = {{5, 6}, {7, 8}};
  Tensor tq = be.upload(XPACK_TYPE_F32, q, 2, 2), tk = be.upload(XPACK_TYPE_F32, k, 2, 2),
         tv = be.upload(XPACK_TYPE_F32, v, 2, 2), to = be.alloc(XPACK_TYPE_F32, 2, 2);
  be.attention(tq, tk, tv, 1, 1, 0, 1.0f, to);
  float att[4];
  be.download(to, att);
  CHECK(att[0] == doctest::Approx(5.0f));
  CHECK(att[1] == doctest::Approx(6.0f));
  // Second query: softmax([0, 1]) over both keys.
  const double p1 = std::exp(1.0) / (1.0 + std::exp(1.0));
  CHECK(att[2] == doctest::Approx(5.0 * (1 - p1) + 7.0 * p1));
  CHECK(att[3] == doctest::Approx(6.0 * (1 - p1) + 8.0 * p1));
}

TEST_CASE("backend: a download in two halves gives the bytes as they were at its start") {
  CpuBackend be(1);
  const float v[3] = {1.5f, -2.0f, 3.25f};
  const Tensor t = be.upload(XPACK_TYPE_F32, v, 3, 1);
  float got[3] = {0, 0, 0};
  CHECK_THROWS_AS(be.finish_download(got), ModelError);  // nothing started
  be.start_download(t);
  be.scale(t, 2.0f, t);  // work between the halves, writing the source itself
  be.finish_download(got);
  CHECK(std::memcmp(got, v, sizeof v) == 0);
  CHECK_THROWS_AS(be.finish_download(got), ModelError);  // one finish per start
  // A start left unfinished is dropped by the next.
  be.start_download(t);
  be.start_download(be.upload(XPACK_TYPE_F32, v, 3, 1));
  be.finish_download(got);
  CHECK(std::memcmp(got, v, sizeof v) == 0);
}

TEST_CASE("cpu backend: the dispatcher's combine_picks, in rank order, each product rounded first") {
  CpuBackend be(1);
  // Two tokens, k = 2: picks (t, j) -> t * 2 + j, computed into rows out of order.
  const float y[4][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  const int32_t rows[4] = {1, 2, 3, 0};  // pick 0 -> row 1, pick 1 -> row 2, ...
  const float weights[4] = {0.5f, 0.25f, 2.0f, 4.0f};
  Tensor ty = be.upload(XPACK_TYPE_F32, y, 2, 4), tr = be.upload(XPACK_TYPE_I32, rows, 4, 1),
         tw = be.upload(XPACK_TYPE_F32, weights, 4, 1);
  Tensor out = be.alloc(XPACK_TYPE_F32, 2, 2);
  be.combine_picks(ty, tr, tw, 2, false, out);
  float o[4];
  be.download(out, o);
  CHECK(o[0] == 3 * 0.5f + 5 * 0.25f);  // token 0: rows 1 and 2
  CHECK(o[1] == 4 * 0.5f + 6 * 0.25f);
  CHECK(o[2] == 7 * 2.0f + 1 * 4.0f);  // token 1: rows 3 and 0
  CHECK(o[3] == 8 * 2.0f + 2 * 4.0f);
  be.combine_picks(ty, tr, tw, 2, true, out);  // accumulate: twice the sum
  be.download(out, o);
  CHECK(o[0] == 2 * (3 * 0.5f + 5 * 0.25f));
  // Rank order with rounding visible: (a*w0 + b*w1) + c*w2 differs from other orders.
  const float big[3][1] = {{1e8f}, {1.0f}, {-1e8f}};
  const int32_t r3[3] = {0, 1, 2};
  const float w3[3] = {1.0f, 1.0f, 1.0f};
  Tensor o1 = be.alloc(XPACK_TYPE_F32, 1, 1);
  be.combine_picks(be.upload(XPACK_TYPE_F32, big, 1, 3), be.upload(XPACK_TYPE_I32, r3, 3, 1),
                   be.upload(XPACK_TYPE_F32, w3, 3, 1), 3, false, o1);
  float v = -1;
  be.download(o1, &v);
  CHECK(v == (1e8f + 1.0f) + -1e8f);  // 0: the 1 is lost in rank order
  // A pick's row outside ys is refused.
  const int32_t bad[4] = {1, 2, 4, 0};
  CHECK_THROWS_AS(be.combine_picks(ty, be.upload(XPACK_TYPE_I32, bad, 4, 1), tw, 2, false, out), ModelError);
}

TEST_CASE("backend: route selects by logits + bias, weighs by the logits, normalises and scales; hash ids kept") {
  CpuBackend be(1);
  // Two rows of 5 experts, top 2. The bias moves expert 4 into row 0's picks
  // although its gated score is the lowest of the two chosen.
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 1.0f, 0.5f,  //
                                     3.0f, -2.0f, 0.0f, 1.0f, 2.5f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.0f, 1.0f};
  const auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  const Tensor b = be.upload(XPACK_TYPE_F32, bias.data(), 5, 1);
  Backend::RouteSpec spec;
  spec.gate = Unary::sigmoid;
  spec.bias = &b;
  spec.normalize = true;
  spec.floor = 1e-6f;
  spec.scale = 2.0f;
  const Tensor l = be.upload(XPACK_TYPE_F32, logits.data(), 5, 2);
  const Tensor ids = be.alloc(XPACK_TYPE_I32, 2, 2), w = be.alloc(XPACK_TYPE_F32, 2, 2);
  be.route(l, spec, ids, w);
  std::vector<int32_t> got_ids(4);
  be.download(ids, got_ids.data());
  // row 0: gated + bias = {.5, .88, .27, .73, 1.62}: experts 4, 1; row 1: {.95, .12, .5, .73, .92 + 1}: 4, 0.
  CHECK(got_ids == std::vector<int32_t>{4, 1, 4, 0});
  const double r0 = sigmoid(0.5) + sigmoid(2.0), r1 = sigmoid(2.5) + sigmoid(3.0);
  check_close(download(be, w), {2 * sigmoid(0.5) / r0, 2 * sigmoid(2.0) / r0, 2 * sigmoid(2.5) / r1, 2 * sigmoid(3.0) / r1},
              1e-6);
  check_close(download(be, l), {sigmoid(0.0), sigmoid(2.0), sigmoid(-1.0), sigmoid(1.0), sigmoid(0.5), sigmoid(3.0),
                                sigmoid(-2.0), sigmoid(0.0), sigmoid(1.0), sigmoid(2.5)},
              1e-6);  // gated in place

  // Hash routing: the ids are given, nothing gated, no scale.
  const std::vector<int32_t> given = {2, 3, 0, 1};
  const Tensor gi = be.upload(XPACK_TYPE_I32, given.data(), 2, 2);
  const Tensor l2 = be.upload(XPACK_TYPE_F32, logits.data(), 5, 2);
  Backend::RouteSpec hash;
  hash.select = false;
  hash.normalize = true;
  hash.floor = 0.5f;  // row 0's sum (-1 + 1 = 0) is floored
  be.route(l2, hash, gi, w);
  std::vector<int32_t> kept(4);
  be.download(gi, kept.data());
  CHECK(kept == given);
  check_close(download(be, w), {-1.0 / 0.5, 1.0 / 0.5, 3.0 / 1.0, -2.0 / 1.0}, 1e-6);
  CHECK_THROWS_AS(be.route(l2, spec, be.alloc(XPACK_TYPE_I32, 6, 2), be.alloc(XPACK_TYPE_F32, 6, 2)), ModelError);
}

TEST_CASE("row window: rows written in place, kept across growth, forgotten from the front") {
  CpuBackend be(1);
  RowWindow win(3);
  win.reset(be);
  std::vector<float> all;
  for (int64_t pos = 0; pos < 40;) {
    const int64_t n = 1 + pos % 5;  // 1..5 rows at a time: the buffer grows several times
    std::vector<float> rows(size_t(n * 3));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = float(pos * 3) + float(i);
    const Tensor dst = win.append_rows(be, n);
    REQUIRE(dst.rows() == n);
    be.copy(be.upload(XPACK_TYPE_F32, rows.data(), 3, n), dst);
    all.insert(all.end(), rows.begin(), rows.end());
    pos += n;
    CHECK(win.end() == pos);
    win.drop_before(pos - 7);  // keep the last 7 positions
    const int64_t first = std::max<int64_t>(0, pos - 7);
    CHECK(win.first() == first);
    const std::vector<float> kept = download(be, win.view());
    CHECK(kept == std::vector<float>(all.begin() + first * 3, all.end()));
  }
}
