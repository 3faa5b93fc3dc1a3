// Random rows of every GGUF weight type and their CPU reference products, for
// the kernel tests (test_quant_kernels.cpp on a GPU, test_units_on_host.cpp on
// the CPU): random quant bytes with sane random scales, and y = W x in double
// through xpack-run's exact decoders (dequant.cpp).
//
// Tolerance (fp32 paths): |y - ref| <= tol * sum_i |w_i * x_i| per output, the sum
// of magnitudes being the scale of the rounding errors of an fp32 dot product.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "dequant.h"

namespace random_blocks {

constexpr double kTolFp32 = 1e-5;

// ggml's type ids.
enum : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
                  kQ6_K = 14, kBF16 = 30, kMXFP4 = 39 };

inline int64_t block_elems(uint32_t type) {
  switch (type) {
    case kF32: case kF16: case kBF16: return 1;
    case kQ8_0: case kMXFP4: return 32;
    default: return 256;
  }
}

// A sane random fp16: |v| in [2^-12, 2^-3), random sign and mantissa.
inline uint16_t rand_f16(std::mt19937& rng) {
  const uint32_t sign = rng() & 1, exp = 3 + rng() % 9, mant = rng() & 0x3FF;
  return uint16_t((sign << 15) | (exp << 10) | mant);
}
inline void put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }

// n_rows rows of ne0 elements of `type`: random bytes, then the fields that are
// floating-point scales (or the values of float types) set to sane values.
inline std::vector<uint8_t> random_weights(uint32_t type, int64_t ne0, int64_t n_rows, std::mt19937& rng) {
  const size_t rb = xrun::row_bytes(type, ne0);
  std::vector<uint8_t> w(rb * size_t(n_rows));
  for (auto& b : w) b = uint8_t(rng());
  const size_t bb = xrun::row_bytes(type, block_elems(type));
  const size_t nb = w.size() / bb;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (size_t i = 0; i < nb; ++i) {
    uint8_t* b = w.data() + i * bb;
    switch (type) {
      case kF32: { const float v = uni(rng); std::memcpy(b, &v, 4); break; }
      case kF16: put16(b, rand_f16(rng)); break;
      case kBF16: {
        const uint32_t sign = rng() & 1, exp = 117 + rng() % 12, mant = rng() & 0x7F;
        put16(b, uint16_t((sign << 15) | (exp << 7) | mant));
        break;
      }
      case kQ8_0: put16(b, rand_f16(rng)); break;
      case kQ2_K: put16(b + 80, rand_f16(rng)); put16(b + 82, rand_f16(rng)); break;
      case kQ3_K: put16(b + 108, rand_f16(rng)); break;
      case kQ4_K: case kQ5_K: put16(b, rand_f16(rng)); put16(b + 2, rand_f16(rng)); break;
      case kQ6_K: put16(b + 208, rand_f16(rng)); break;
      case kMXFP4: b[0] = uint8_t(118 + rng() % 21); break;  // 2^-10 .. 2^10
      default: break;
    }
  }
  return w;
}

inline std::vector<float> random_x(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = uni(rng);
  return x;
}

// CPU reference: ref[t][o] and mag[t][o] = sum |w*x| in double.
struct Ref {
  std::vector<double> y, mag;
};
inline Ref reference(uint32_t type, const std::vector<uint8_t>& w, int64_t ne0, int64_t ne1, const float* x,
                     int n_tokens) {
  std::vector<float> wf(size_t(ne0 * ne1));
  xrun::dequantize(type, w.data(), wf.data(), ne0 * ne1);
  Ref r;
  r.y.assign(size_t(n_tokens * ne1), 0.0);
  r.mag.assign(size_t(n_tokens * ne1), 0.0);
  for (int t = 0; t < n_tokens; ++t)
    for (int64_t o = 0; o < ne1; ++o) {
      double s = 0, m = 0;
      const float* wr = wf.data() + o * ne0;
      const float* xr = x + t * ne0;
      for (int64_t i = 0; i < ne0; ++i) {
        const double p = double(wr[i]) * double(xr[i]);
        s += p;
        m += std::fabs(p);
      }
      r.y[size_t(t * ne1 + o)] = s;
      r.mag[size_t(t * ne1 + o)] = m;
    }
  return r;
}

// The first m outputs of a reference (its first tokens).
inline Ref head(const Ref& ref, size_t m) {
  return Ref{std::vector<double>(ref.y.begin(), ref.y.begin() + std::ptrdiff_t(m)),
             std::vector<double>(ref.mag.begin(), ref.mag.begin() + std::ptrdiff_t(m))};
}

// Number of outputs outside the tolerance (printing the first few).
inline int count_bad(const std::vector<float>& got, const Ref& ref, double tol, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref.y[i]);
    if (!(err <= tol * ref.mag[i] + 1e-37)) {
      if (bad < 5)
        std::fprintf(stderr, "%s: output %zu got %.9g want %.9g (sum|wx| %.3g)\n", what, i, got[i],
                     ref.y[i], ref.mag[i]);
      ++bad;
    }
  }
  return bad;
}

// MXFP4 at every E8M0 exponent: 255 rows of ne0 inputs, row e with exponent e in
// all its blocks, whose 32 codes hold all 16 nibbles (shuffled); x of two tokens,
// token 0 in [-1, 1] and token 1 the same times 2^-16.
struct EveryE8m0 {
  static constexpr int64_t kRows = 255;
  int64_t ne0;
  std::vector<uint8_t> w;
  std::vector<float> x;
  Ref ref;
  EveryE8m0(int64_t ne0_, std::mt19937& rng) : ne0(ne0_), w(xrun::row_bytes(kMXFP4, ne0_) * kRows) {
    const int64_t nblk = ne0 / 32;
    for (int64_t e = 0; e < kRows; ++e)
      for (int64_t blk = 0; blk < nblk; ++blk) {
        uint8_t* b = w.data() + size_t(e * nblk + blk) * 17;
        b[0] = uint8_t(e);
        uint8_t codes[32];
        for (int i = 0; i < 32; ++i) codes[i] = uint8_t(i & 15);
        std::shuffle(codes, codes + 32, rng);
        for (int j = 0; j < 16; ++j) b[1 + j] = uint8_t(codes[j] | (codes[j + 16] << 4));
      }
    x = random_x(size_t(2 * ne0), rng);
    for (int64_t i = 0; i < ne0; ++i) x[size_t(ne0 + i)] = std::ldexp(x[size_t(i)], -16);
    ref = reference(kMXFP4, w, ne0, kRows, x.data(), 2);
  }
  // got (2 x 255 outputs) against the reference: rows whose sums stay in range
  // within tol (e <= 240 for token 0, e >= 100 for token 1); where ggml's weights
  // overflow to inf (e >= 253) the CPU's inf of the same sign, or NaN where the
  // CPU's is NaN. Counts what it checked (every exponent at least once).
  struct Result {
    int checked = 0, nonfinite = 0, bad = 0;
  };
  Result check(const std::vector<float>& got, double tol, const char* what) const {
    Result r;
    for (int t = 0; t < 2; ++t)
      for (int64_t e = 0; e < kRows; ++e) {
        const size_t i = size_t(t * kRows + e);
        const double want = ref.y[i];
        if (!std::isfinite(want)) {
          ++r.nonfinite;
          if (!(std::isnan(want) ? std::isnan(got[i]) : double(got[i]) == want)) {
            ++r.bad;
            std::fprintf(stderr, "%s: e=%d t=%d: got %g want %g\n", what, int(e), t, got[i], want);
          }
          continue;
        }
        if ((t == 0 && e > 240) || (t == 1 && e < 100)) continue;
        ++r.checked;
        if (!(std::fabs(double(got[i]) - want) <= tol * ref.mag[i] + 1e-45)) {
          ++r.bad;
          std::fprintf(stderr, "%s: e=%d t=%d: got %.9g want %.9g\n", what, int(e), t, got[i], want);
        }
      }
    return r;
  }
};

}  // namespace random_blocks
