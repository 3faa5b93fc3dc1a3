// RoPE / YaRN, following ggml's float arithmetic step by step (the angle is
// advanced by repeated multiplication, as ggml does) so long positions agree
// with llama.cpp to float rounding rather than to a different formula.
#include "rope.h"

#include <algorithm>
#include <cmath>

namespace xrun::ds4 {

namespace {

// Dimension index where the wavelength passes n_rot full turns over the
// original context (YaRN's correction range).
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * static_cast<float>(M_PI))) /
         (2.0f * std::log(base));
}

// 1 below the correction range (extrapolate), 0 above it (interpolate).
float yarn_ramp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

void rope_cache(const RopeParams& p, int64_t pos, bool inverse, float* cache) {
  float corr[2] = {0.0f, 0.0f};
  if (p.ext_factor != 0.0f) {
    const float start = std::floor(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base));
    const float end = std::ceil(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base));
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
      const float mix = yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
      angle = theta_interp * (1.0f - mix) + theta_extrap * mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cache[i0] = std::cos(angle) * mscale;
    cache[i0 + 1] = std::sin(angle) * mscale * sin_sign;
    theta *= theta_scale;
  }
}

void rope_apply(const float* cache, int n_dims, float* x) {
  for (int i0 = 0; i0 < n_dims; i0 += 2) {
    const float c = cache[i0], s = cache[i0 + 1];
    const float x0 = x[i0], x1 = x[i0 + 1];
    x[i0] = x0 * c - x1 * s;
    x[i0 + 1] = x0 * s + x1 * c;
  }
}

}  // namespace xrun::ds4
