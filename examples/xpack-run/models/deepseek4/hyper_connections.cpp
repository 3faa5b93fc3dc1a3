// Hyper-connection mixing, in ggml's operation order (pre = sigmoid + eps,
// post = 2 sigmoid, comb = softmax then alternating column/row normalisation,
// each divided by (sum + eps)).
#include "hyper_connections.h"

#include <algorithm>
#include <cmath>

#include <functional>  // ops.h uses std::function before including it

#include "../../ops.h"

namespace xrun::ds4 {

namespace {

float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

std::vector<float> load_vector(const Weights& w, const std::string& name, int64_t n) {
  return to_float(w.get(name, {n}));
}

}  // namespace

void hc_mixes(const Hparams& hp, const WeightTensor& fn, const float* stream, int n, float* mixes) {
  const int64_t width = hp.hc_mult * hp.n_embd;
  std::vector<float> normed(static_cast<size_t>(n * width));
  for (int t = 0; t < n; ++t) {
    rms_norm(stream + t * width, nullptr, width, hp.rms_eps, normed.data() + t * width);
  }
  matmul(fn, normed.data(), n, mixes);
}

void hc_weighted_sum(const Hparams& hp, const float* stream_row, const float* weight, float* out) {
  const int64_t d = hp.n_embd;
  for (int64_t i = 0; i < d; ++i) out[i] = stream_row[i] * weight[0];
  for (int64_t h = 1; h < hp.hc_mult; ++h) {
    const float* copy = stream_row + h * d;
    for (int64_t i = 0; i < d; ++i) out[i] += copy[i] * weight[h];
  }
}

HcSite::HcSite(const Weights& w, const Hparams& hp, const std::string& prefix) : hp_(hp) {
  const int64_t mix = hp.hc_mix_dim();
  fn_ = &w.get(prefix + "_fn.weight", {hp.hc_mult * hp.n_embd, mix});
  base_ = load_vector(w, prefix + "_base.weight", mix);
  scale_ = load_vector(w, prefix + "_scale.weight", 3);
}

void HcSite::sinkhorn(float* c) const {
  // c[src * hc + dst]; first a softmax over dst for every src.
  const int64_t hc = hp_.hc_mult;
  const float eps = hp_.hc_eps;
  for (int64_t s = 0; s < hc; ++s) softmax_inplace(c + s * hc, hc);
  for (int64_t i = 0; i < hc * hc; ++i) c[i] += eps;

  auto normalize_columns = [&] {
    for (int64_t d = 0; d < hc; ++d) {
      double sum = 0.0;
      for (int64_t s = 0; s < hc; ++s) sum += c[s * hc + d];
      const float denom = static_cast<float>(sum) + eps;
      for (int64_t s = 0; s < hc; ++s) c[s * hc + d] /= denom;
    }
  };
  auto normalize_rows = [&] {
    for (int64_t s = 0; s < hc; ++s) {
      double sum = 0.0;
      for (int64_t d = 0; d < hc; ++d) sum += c[s * hc + d];
      const float denom = static_cast<float>(sum) + eps;
      for (int64_t d = 0; d < hc; ++d) c[s * hc + d] /= denom;
    }
  };
  normalize_columns();
  for (int64_t it = 1; it < hp_.hc_sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
}

void HcSite::pre(const float* stream, int n, float* input, HcMixing& mix) const {
  const int64_t hc = hp_.hc_mult, md = hp_.hc_mix_dim(), width = hc * hp_.n_embd;
  std::vector<float> mixes(static_cast<size_t>(n * md));
  hc_mixes(hp_, *fn_, stream, n, mixes.data());

  mix.post.assign(static_cast<size_t>(n * hc), 0.0f);
  mix.comb.assign(static_cast<size_t>(n * hc * hc), 0.0f);
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int t = 0; t < n; ++t) {
    const float* m = mixes.data() + t * md;
    for (int64_t h = 0; h < hc; ++h) {
      pre[h] = sigmoidf(m[h] * scale_[0] + base_[h]) + hp_.hc_eps;
      mix.post[t * hc + h] = 2.0f * sigmoidf(m[hc + h] * scale_[1] + base_[hc + h]);
    }
    float* c = mix.comb.data() + t * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) c[i] = m[2 * hc + i] * scale_[2] + base_[2 * hc + i];
    sinkhorn(c);
    hc_weighted_sum(hp_, stream + t * width, pre.data(), input + t * hp_.n_embd);
  }
}

void HcSite::post(const float* output, const float* residual, int n, const HcMixing& mix,
                  float* stream) const {
  const int64_t hc = hp_.hc_mult, d = hp_.n_embd, width = hc * d;
  for (int t = 0; t < n; ++t) {
    const float* f = output + t * d;
    const float* res = residual + t * width;
    const float* post = mix.post.data() + t * hc;
    const float* c = mix.comb.data() + t * hc * hc;
    for (int64_t dst = 0; dst < hc; ++dst) {
      float* out = stream + t * width + dst * d;
      for (int64_t i = 0; i < d; ++i) out[i] = f[i] * post[dst];
      for (int64_t src = 0; src < hc; ++src) {
        const float weight = c[src * hc + dst];
        const float* copy = res + src * d;
        for (int64_t i = 0; i < d; ++i) out[i] += copy[i] * weight;
      }
    }
  }
}

HcHead::HcHead(const Weights& w, const Hparams& hp) : hp_(hp) {
  fn_ = &w.get("output_hc_fn.weight", {hp.hc_mult * hp.n_embd, hp.hc_mult});
  base_ = load_vector(w, "output_hc_base.weight", hp.hc_mult);
  scale_ = load_vector(w, "output_hc_scale.weight", 1);
}

void HcHead::collapse(const float* stream, int n, float* out) const {
  const int64_t hc = hp_.hc_mult, width = hc * hp_.n_embd;
  std::vector<float> mixes(static_cast<size_t>(n * hc));
  hc_mixes(hp_, *fn_, stream, n, mixes.data());
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int t = 0; t < n; ++t) {
    for (int64_t h = 0; h < hc; ++h) {
      pre[h] = sigmoidf(mixes[t * hc + h] * scale_[0] + base_[h]) + hp_.hc_eps;
    }
    hc_weighted_sum(hp_, stream + t * width, pre.data(), out + t * hp_.n_embd);
  }
}

}  // namespace xrun::ds4
