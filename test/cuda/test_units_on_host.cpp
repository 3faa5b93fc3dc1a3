// The decode kernel's units (cuda/matvec_units.cuh: how one lane turns a unit of
// R rows' bytes and NT tokens' x into partial sums) run on the CPU, through host
// stand-ins for the CUDA names they use (units_on_host/), against the CPU
// decoders: every type, every layout of x a kernel hands them, within the fp32
// bound of the GPU test (random_blocks.h). What this cannot see is the kernels
// around the units (their grids, staging loops, shuffles and launch rules): those
// are tested on a GPU (test_quant_kernels.cpp). It needs neither a GPU nor nvcc,
// so CI runs it; a unit's arithmetic or byte offsets that break show here first.
#include "cuda_host.h"  // first: the CUDA names for the kernel headers

#include "kquant_mma.cuh"
#include "matvec_units.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "random_blocks.h"

namespace dev = xpack::kernels::dev;
using namespace random_blocks;

namespace {

// How the kernel hands x to a unit: read where it lies in global memory (a row
// of ne0 floats a token), staged in shared memory with each unit's floats
// padded by 4, or staged as int8 terms (the dp4a units: each unit's floats
// copied into the bytes its terms take, then a warp turns each 32-input chunk
// into terms in place, Ty::stage_chunk).
enum class XLayout { kGlobal, kStaged, kTerms };

// 16-byte aligned float storage, as x is on the device.
struct Floats {
  std::vector<float4> v;
  explicit Floats(size_t n) : v((n + 3) / 4) {}
  float* data() { return reinterpret_cast<float*>(v.data()); }
};

// Units read whole aligned words, a few bytes past a matrix's last block where it
// ends inside one (ldwords, TMXFP4::load): on the device allocations are whole
// words and more; here the weights get this much slack after their bytes.
constexpr size_t kSlack = 16;

// y[t * ne1 + o] for all rows o and NT tokens of x (token-major, ne0 a token)
// by unit Ty in groups of R rows (w: ne1 rows of `type`, then kSlack bytes):
// each group sums its units in order, as one lane that owned them all would (the
// kernel splits them over lanes and adds the lanes' sums by shuffles: other
// rounding, within the same bound).
template <class Ty, int NT, int R>
std::vector<float> unit_products(uint32_t type, const std::vector<uint8_t>& w, int ne0, int ne1,
                                 const std::vector<float>& x, XLayout layout) {
  const size_t rb = xrun::row_bytes(type, ne0);
  REQUIRE(w.size() == rb * size_t(ne1) + kSlack);
  const int units = ne0 / Ty::kUnit;
  int xs = Ty::kUnit;
  if (layout == XLayout::kStaged) xs = Ty::kUnit + 4;
  if constexpr (requires { Ty::kXs; })
    if (layout == XLayout::kTerms) xs = Ty::kXs;
  Floats staged(NT * size_t(units) * size_t(xs));
  const float* xp[NT];
  for (int t = 0; t < NT; ++t) {
    const float* src = x.data() + size_t(t) * size_t(ne0);
    if (layout == XLayout::kGlobal) {
      xp[t] = src;
      continue;
    }
    float* dst = staged.data() + size_t(t) * size_t(units) * size_t(xs);
    for (int e = 0; e < ne0; ++e) dst[(e / Ty::kUnit) * xs + e % Ty::kUnit] = src[e];
    xp[t] = dst;
  }
  if constexpr (requires { Ty::stage_chunk; }) {
    if (layout == XLayout::kTerms) {
      auto* bytes = reinterpret_cast<uint8_t*>(staged.data());
      const int chunks = units * Ty::kChunks;
      run_warp([&] {
        for (int t = 0; t < NT; ++t)
          for (int c = 0; c < chunks; ++c)
            Ty::stage_chunk(bytes + (size_t(t) * size_t(units) + size_t(c / Ty::kChunks)) * (4 * size_t(xs)),
                            c % Ty::kChunks);
      });
    }
  }
  std::vector<float> y(NT * size_t(ne1));
  for (int o0 = 0; o0 < ne1; o0 += R) {
    const uint8_t* rp[R];
    for (int r = 0; r < R; ++r) rp[r] = w.data() + size_t(std::min(o0 + r, ne1 - 1)) * rb;
    dev::Acc<NT, R> acc = {};
    for (int u = 0; u < units; ++u) Ty::template run<NT, R>(rp, u, xp, acc, xs);
    for (int r = 0; r < R && o0 + r < ne1; ++r)
      for (int t = 0; t < NT; ++t) y[size_t(t) * size_t(ne1) + size_t(o0 + r)] = acc[r][t];
  }
  return y;
}

// Random rows of `type` (ne1 of ne0) and 8 tokens of x, with the reference.
struct Case {
  int ne1;
  std::vector<uint8_t> w;
  std::vector<float> x;
  Ref ref;
  Case(uint32_t type, int ne0, int ne1_, std::mt19937& rng)
      : ne1(ne1_), w(random_weights(type, ne0, ne1_, rng)), x(random_x(size_t(8) * size_t(ne0), rng)),
        ref(reference(type, w, ne0, ne1_, x.data(), 8)) {
    w.resize(w.size() + kSlack);
  }
  Ref first(int nt) const { return head(ref, size_t(nt) * size_t(ne1)); }
};

// Unit Ty at 1, 3 and 8 tokens (R = 4, 2, 2 rows: the kernel's choices) and
// with R = 1, in each layout: within the bound of the reference.
template <class Ty>
void check_unit(uint32_t type, int ne0, const char* what, std::initializer_list<XLayout> layouts,
                double tol = kTolFp32) {
  std::mt19937 rng(ne0 * 131 + type);
  const Case c(type, ne0, 37, rng);
  for (const XLayout layout : layouts) {
    CAPTURE(what);
    CAPTURE(ne0);
    CAPTURE(int(layout));
    CHECK(count_bad(unit_products<Ty, 1, 4>(type, c.w, ne0, c.ne1, c.x, layout), c.first(1), tol, what) == 0);
    CHECK(count_bad(unit_products<Ty, 1, 1>(type, c.w, ne0, c.ne1, c.x, layout), c.first(1), tol, what) == 0);
    CHECK(count_bad(unit_products<Ty, 3, 2>(type, c.w, ne0, c.ne1, c.x, layout), c.first(3), tol, what) == 0);
    CHECK(count_bad(unit_products<Ty, 8, 2>(type, c.w, ne0, c.ne1, c.x, layout), c.first(8), tol, what) == 0);
  }
}

constexpr auto kBoth = {XLayout::kGlobal, XLayout::kStaged};

}  // namespace

TEST_CASE("decode units on the CPU: float types") {
  check_unit<dev::TF32>(kF32, 8 * 13, "TF32", kBoth);
  check_unit<dev::TF32V<1>>(kF32, 8 * 13, "TF32V<1> (read-only loads)", kBoth);
  check_unit<dev::TF32V<2>>(kF32, 8 * 13, "TF32V<2> (4-float units)", kBoth);
  check_unit<dev::THalf<false>>(kF16, 8 * 13, "THalf<f16>", kBoth);
  check_unit<dev::THalf<true>>(kBF16, 8 * 13, "THalf<bf16>", kBoth);
  // One element a unit: rows that are not whole 16-byte vectors (x read in place).
  check_unit<dev::TScalar<kF32>>(kF32, 37, "TScalar<f32>", {XLayout::kGlobal});
  check_unit<dev::TScalar<kF16>>(kF16, 37, "TScalar<f16>", {XLayout::kGlobal});
  check_unit<dev::TScalar<kBF16>>(kBF16, 37, "TScalar<bf16>", {XLayout::kGlobal});
}

TEST_CASE("decode units on the CPU: quantized types") {
  // 13 blocks of 34 and 17 bytes, 1 and 3 of 110 and 210: rows that start at
  // every byte offset their alignment allows.
  for (const int blocks : {1, 3}) {
    check_unit<dev::TQ8_0>(kQ8_0, 32 * (blocks == 1 ? 8 : 13), "TQ8_0", kBoth);
    check_unit<dev::TMXFP4>(kMXFP4, 32 * (blocks == 1 ? 8 : 13), "TMXFP4", kBoth);
    check_unit<dev::TQ2_K>(kQ2_K, 256 * blocks, "TQ2_K", kBoth);
    check_unit<dev::TQ3_K>(kQ3_K, 256 * blocks, "TQ3_K", kBoth);
    check_unit<dev::TQ45_K<false>>(kQ4_K, 256 * blocks, "TQ45_K<q4>", kBoth);
    check_unit<dev::TQ45_K<true>>(kQ5_K, 256 * blocks, "TQ45_K<q5>", kBoth);
    check_unit<dev::TQ6_K>(kQ6_K, 256 * blocks, "TQ6_K", kBoth);
  }
}

// The dp4a units' integer sums are exact and x's terms keep it to 2^-27 of a chunk's
// largest |x|, so they are held to a tenth of the fp32 bound: at kTolFp32 a wrong
// scale on the terms' low half (2^-14 of the sum, random signs) went unseen.
constexpr double kTolDp4a = kTolFp32 / 10;

TEST_CASE("decode units on the CPU: the K-quants on dp4a, x staged as int8 terms") {
  for (const int blocks : {1, 3, 10}) {
    check_unit<dev::TQ2_K8>(kQ2_K, 256 * blocks, "TQ2_K8", {XLayout::kTerms}, kTolDp4a);
    check_unit<dev::TQ3_K8>(kQ3_K, 256 * blocks, "TQ3_K8", {XLayout::kTerms}, kTolDp4a);
    check_unit<dev::TQ3_K8W>(kQ3_K, 256 * blocks, "TQ3_K8W", {XLayout::kTerms}, kTolDp4a);
    check_unit<dev::TQ45_K8<false>>(kQ4_K, 256 * blocks, "TQ45_K8<q4>", {XLayout::kTerms}, kTolDp4a);
    check_unit<dev::TQ45_K8<true>>(kQ5_K, 256 * blocks, "TQ45_K8<q5>", {XLayout::kTerms}, kTolDp4a);
    check_unit<dev::TQ6_K8>(kQ6_K, 256 * blocks, "TQ6_K8", {XLayout::kTerms}, kTolDp4a);
    check_unit<dev::TMXFP4_8>(kMXFP4, 32 * (blocks == 1 ? 8 : 13 * blocks), "TMXFP4_8", {XLayout::kTerms}, kTolDp4a);
  }
}

// The stand-ins the units' warp-wide staging uses: every lane gets the butterfly's
// sum and the warp's maximum, as on the device.
TEST_CASE("decode units on the CPU: the warp of host threads exchanges values like a warp") {
  float sums[32] = {};
  unsigned maxes[32] = {};
  run_warp([&] {
    const unsigned lane = threadIdx.x;
    float v = float(lane + 1);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    sums[lane] = v;
    __syncwarp();
    maxes[lane] = __reduce_max_sync(0xFFFFFFFFu, (lane * 7u) % 32u);
  });
  for (int l = 0; l < 32; ++l) {
    CHECK(sums[l] == 528.0f);
    CHECK(maxes[l] == 31u);
  }
}

// MXFP4 at every E8M0 exponent with every nibble (random_blocks.h's EveryE8m0, the
// GPU test's case): within the bound where the sums stay in range, the CPU's inf
// or NaN where ggml's weights overflow.
template <class Ty>
void check_every_e8m0(const char* what, XLayout layout) {
  std::mt19937 rng(4);
  const EveryE8m0 c(512, rng);
  auto w = c.w;
  w.resize(w.size() + kSlack);
  const auto r = c.check(unit_products<Ty, 2, 2>(kMXFP4, w, int(c.ne0), int(EveryE8m0::kRows), c.x, layout),
                         kTolFp32, what);
  CHECK(r.bad == 0);
  CHECK(r.nonfinite > 0);
  CHECK(r.checked >= EveryE8m0::kRows + 2);
}

TEST_CASE("decode units on the CPU: MXFP4 at every E8M0 exponent 0..254 with every nibble") {
  check_every_e8m0<dev::TMXFP4>("TMXFP4", XLayout::kGlobal);
  check_every_e8m0<dev::TMXFP4>("TMXFP4", XLayout::kStaged);
  check_every_e8m0<dev::TMXFP4_8>("TMXFP4_8", XLayout::kTerms);
}

// Q2_K's and Q3_K's block products on the tensor cores (kquant_mma.cuh), a tile of
// 16 rows and NT tokens, each lane's columns added as a kernel would add them,
// against the CPU decoder.
template <uint32_t kType, int NT>
void check_kq_mma(int blocks, float outlier = 0.0f) {
  constexpr int kRows = 16, kPairs = (NT + 1) / 2;
  constexpr size_t kBlock = kType == kQ2_K ? 84 : 110;
  const int ne0 = 256 * blocks, chunks = ne0 / 32;
  std::mt19937 rng(77 + blocks * 8 + NT + kType);
  Case c(kType, ne0, kRows, rng);
  const size_t rb = xrun::row_bytes(kType, ne0);
  const int nb = ne0 / 256;
  if (outlier != 0.0f) {  // one input a block and token this many times the others' scale
    for (int t = 0; t < 8; ++t)
      for (int b = 0; b < nb; ++b) c.x[size_t(t) * size_t(ne0) + size_t(b) * 256 + size_t(b * 37 + t * 11) % 256] *= outlier;
    c.ref = reference(kType, c.w, ne0, kRows, c.x.data(), 8);
  }
  const size_t stride = size_t(kPairs) * 256;  // between a block's chunks
  std::vector<uint8_t> stage(size_t(chunks) * stride);
  std::vector<float> units(size_t(nb) * NT);
  std::vector<int> sums(size_t(nb) * NT * 4);
  run_warp([&] {
    for (int b = 0; b < nb; ++b)
      for (int t = 0; t < NT; ++t) {
        const size_t bt = size_t(b) * NT + size_t(t);
        dev::kq::stage_block(c.x.data() + size_t(t) * size_t(ne0) + size_t(b) * 256,
                             stage.data() + size_t(8 * b) * stride + size_t(t) * 128, stride, &units[bt],
                             kType == kQ3_K ? &sums[4 * bt] : nullptr);
      }
  });
  std::vector<float> y(static_cast<size_t>(NT) * kRows);
  run_warp([&] {
    const int lane = int(threadIdx.x), g = lane >> 2, cq = lane & 3;
    float acc[kPairs][2] = {};
    for (int b = 0; b < nb; ++b) {
      const uint8_t* ba = c.w.data() + size_t(g) * rb + size_t(b) * kBlock;
      const uint8_t* bb = c.w.data() + size_t(g + 8) * rb + size_t(b) * kBlock;
      const uint8_t* chunk = stage.data() + size_t(8 * b) * stride;
      if constexpr (kType == kQ2_K)
        dev::kq::q2k_block<NT>(ba, bb, chunk, stride, &units[size_t(b) * NT], acc);
      else
        dev::kq::q3k_block<NT>(ba, bb, chunk, stride, &units[size_t(b) * NT], &sums[size_t(b) * NT * 4], acc);
    }
    for (int p = 0; p < kPairs; ++p)
      for (int r = 0; r < 2; ++r) {
        float v = acc[p][r] * ((cq & 1) ? 0x1p-14f : 1.0f);
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
        const int tok = 2 * p + (cq >> 1);
        if ((cq & 1) == 0 && tok < NT) y[size_t(tok) * kRows + size_t(g + 8 * r)] = v;
      }
  });
  CAPTURE(kType);
  CAPTURE(blocks);
  CAPTURE(NT);
  CAPTURE(outlier);
  CHECK(count_bad(y, c.first(NT), kTolDp4a, "kquant_mma") == 0);
}

TEST_CASE("K-quants on the tensor cores: Q2_K's and Q3_K's block products") {
  for (const int blocks : {1, 3}) {
    check_kq_mma<kQ2_K, 1>(blocks);
    check_kq_mma<kQ2_K, 2>(blocks);
    check_kq_mma<kQ2_K, 8>(blocks);
    check_kq_mma<kQ3_K, 1>(blocks);
    check_kq_mma<kQ3_K, 2>(blocks);
    check_kq_mma<kQ3_K, 8>(blocks);
  }
  // Activations with outliers: the terms' error is 2^-27 of the block's largest |x|,
  // so the others' products lose relative precision; still within a tenth of the bound.
  for (const float outlier : {100.0f, 1000.0f, 10000.0f}) {
    check_kq_mma<kQ2_K, 2>(3, outlier);
    check_kq_mma<kQ3_K, 2>(3, outlier);
  }
}
