// RoPE / YaRN of the deepseek4 model (examples/xpack-run/models/deepseek4/rope.cpp)
// against the closed-form angles: plain RoPE turns pair i by pos * base^(-2i/n);
// YaRN keeps the fast-turning pairs below the correction range (extrapolation),
// divides the slow ones above it by the scaling factor (interpolation) and, with
// DeepSeek-V4's attn_factor, keeps every rotation unit-length.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "models/deepseek4/rope.h"

using xrun::ds4::RopeParams;
using xrun::ds4::rope_apply;
using xrun::ds4::rope_cache;

namespace {

RopeParams plain(int n_dims, float base) {
  RopeParams p;
  p.n_dims = n_dims;
  p.freq_base = base;
  return p;
}

RopeParams yarn(int n_dims, float base, float factor) {
  RopeParams p = plain(n_dims, base);
  p.freq_scale = 1.0f / factor;
  p.ext_factor = 1.0f;
  p.beta_fast = 32.0f;
  p.beta_slow = 1.0f;
  p.n_ctx_orig = 65536;
  p.attn_factor = 1.0f / (1.0f + 0.1f * std::log(factor));
  return p;
}

// The angle pair i was turned by, read back from the cache.
double angle_of(const std::vector<float>& cache, int i) { return std::atan2(cache[2 * i + 1], cache[2 * i]); }

double wrap(double a) { return std::remainder(a, 2 * M_PI); }

}  // namespace

TEST_CASE("deepseek4 rope: plain rotation follows pos * base^(-2i/n) and pairs adjacent values") {
  const RopeParams p = plain(32, 10000.0f);
  std::vector<float> cache(32);
  for (int64_t pos : {0, 1, 7, 300, 4095}) {
    rope_cache(p, pos, false, cache.data());
    for (int i = 0; i < 16; ++i) {
      const double want = pos * std::pow(10000.0, -2.0 * i / 32);
      CHECK(std::hypot(cache[2 * i], cache[2 * i + 1]) == doctest::Approx(1.0).epsilon(1e-6));
      CHECK(wrap(angle_of(cache, i) - want) == doctest::Approx(0.0).epsilon(1e-3 + 1e-6 * pos));
    }
  }
  // Pair (x0, x1) turns as a complex number: (1, 0) at angle a becomes (cos a, sin a).
  rope_cache(p, 5, false, cache.data());
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  rope_apply(cache.data(), 32, x.data());
  CHECK(x[0] == doctest::Approx(std::cos(5.0)).epsilon(1e-6));
  CHECK(x[1] == doctest::Approx(std::sin(5.0)).epsilon(1e-6));
  CHECK(x[2] == 0.0f);
}

TEST_CASE("deepseek4 rope: the inverse rotation undoes the forward one") {
  for (const RopeParams& p : {plain(32, 10000.0f), yarn(32, 160000.0f, 16.0f), yarn(64, 160000.0f, 4.0f)}) {
    std::vector<float> fwd(p.n_dims), inv(p.n_dims), x(p.n_dims), orig(p.n_dims);
    for (int i = 0; i < p.n_dims; ++i) orig[i] = x[i] = std::sin(0.37f * i + 1.0f);
    for (int64_t pos : {0, 3, 127, 1000}) {
      rope_cache(p, pos, false, fwd.data());
      rope_cache(p, pos, true, inv.data());
      x = orig;
      rope_apply(fwd.data(), p.n_dims, x.data());
      if (pos > 0) CHECK(x != orig);
      rope_apply(inv.data(), p.n_dims, x.data());
      for (int i = 0; i < p.n_dims; ++i) CHECK(x[i] == doctest::Approx(orig[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("deepseek4 rope: YaRN extrapolates fast pairs, interpolates slow ones, keeps unit length") {
  const float factor = 16.0f;
  const RopeParams p = yarn(32, 160000.0f, factor);
  std::vector<float> cache(32);
  const int64_t pos = 200;
  rope_cache(p, pos, false, cache.data());
  // The correction range in pair indices, from the number of turns over the original context.
  auto corr = [&](double turns) { return 32 * std::log(65536 / (turns * 2 * M_PI)) / (2 * std::log(160000.0)); };
  const double low = std::max(0.0, std::floor(corr(32.0))), high = std::min(31.0, std::ceil(corr(1.0)));
  REQUIRE(low < high);
  int n_extrap = 0, n_interp = 0;
  for (int i = 0; i < 16; ++i) {
    const double theta = pos * std::pow(160000.0, -2.0 * i / 32);
    CHECK(std::hypot(cache[2 * i], cache[2 * i + 1]) == doctest::Approx(1.0).epsilon(1e-5));
    if (i <= low) {
      CHECK(wrap(angle_of(cache, i) - theta) == doctest::Approx(0.0).epsilon(1e-3));
      ++n_extrap;
    } else if (i >= high) {
      CHECK(wrap(angle_of(cache, i) - theta / factor) == doctest::Approx(0.0).epsilon(1e-4));
      ++n_interp;
    }
  }
  CHECK(n_extrap > 0);
  CHECK(n_interp > 0);
}
