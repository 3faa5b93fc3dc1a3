// RoPE with YaRN, following ggml's rope_ext float arithmetic step by step (the
// angle is advanced by repeated multiplication, as ggml does) so long positions
// agree with llama.cpp to float rounding rather than to a different formula.
// Header-only: the CPU backend and deepseek4's closed-form test share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace xrun {

// One family of rotary embeddings, with ggml's rope_ext parameters.
struct RopeYarn {
  int n_dims = 0;            // rotated dims
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // 1 / scaling factor
  float ext_factor = 0.0f;   // 1 when YaRN's ramp is active
  float attn_factor = 1.0f;  // magnitude scale fed to the rotation
  float beta_fast = 0.0f;
  float beta_slow = 0.0f;
  int n_ctx_orig = 0;
};

namespace rope_detail {

// Dimension index where the wavelength passes n_rot full turns over the
// original context (YaRN's correction range).
inline float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * static_cast<float>(M_PI))) /
         (2.0f * std::log(base));
}

// 1 below the correction range (extrapolate), 0 above it (interpolate).
inline float yarn_ramp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace rope_detail

// cos/sin of every pair for one position: cache[2i] = cos, cache[2i+1] = sin
// (sin negated when `inverse`).
inline void rope_yarn_cache(const RopeYarn& p, int64_t pos, bool inverse, float* cache) {
  float corr[2] = {0.0f, 0.0f};
  if (p.ext_factor != 0.0f) {
    const float start = std::floor(rope_detail::yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base));
    const float end = std::ceil(rope_detail::yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base));
    corr[0] = std::max(0.0f, start);
    corr[1] = std::min(static_cast<float>(p.n_dims - 1), end);
  }
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  const float sin_sign = inverse ? -1.0f : 1.0f;

  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
    const float theta_extrap = theta;
    const float theta_interp = p.freq_scale * theta_extrap;
    float angle = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float mix = rope_detail::yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
      angle = theta_interp * (1.0f - mix) + theta_extrap * mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cache[i0] = std::cos(angle) * mscale;
    cache[i0 + 1] = std::sin(angle) * mscale * sin_sign;
    theta *= theta_scale;
  }
}

// Rotates the adjacent pairs of x[0 .. n_dims) in place with a cache from rope_yarn_cache.
inline void rope_yarn_apply(const float* cache, int n_dims, float* x) {
  for (int i0 = 0; i0 < n_dims; i0 += 2) {
    const float c = cache[i0], s = cache[i0 + 1];
    const float x0 = x[i0], x1 = x[i0 + 1];
    x[i0] = x0 * c - x1 * s;
    x[i0 + 1] = x0 * s + x1 * c;
  }
}

}  // namespace xrun
