// Hyper-connection mixing on the CPU, in ggml's operation order (pre = sigmoid
// + eps, post = 2 sigmoid, comb = softmax then alternating column/row
// normalisation, each divided by (sum + eps)).
#include <cmath>
#include <vector>

#include "../../cpu_backend.h"
#include "ds4_ops_cpu.h"
#include "xpack/xpack.h"

namespace xrun::ds4 {

namespace {

// c[src * hc + dst]: a softmax over dst for every src, then Sinkhorn.
void sinkhorn(const HcShape& s, float* c) {
  const int64_t hc = s.hc;
  const float eps = s.eps;
  for (int64_t src = 0; src < hc; ++src) softmax_row(c + src * hc, hc);
  for (int64_t i = 0; i < hc * hc; ++i) c[i] += eps;

  // Divides each line of c by (its sum + eps): the columns (dst fixed) are
  // lines of stride 1 between lines and hc between entries, the rows the reverse.
  auto normalize_lines = [&](int64_t line_stride, int64_t entry_stride) {
    for (int64_t l = 0; l < hc; ++l) {
      float* line = c + l * line_stride;
      double sum = 0.0;
      for (int64_t e = 0; e < hc; ++e) sum += line[e * entry_stride];
      const float denom = static_cast<float>(sum) + eps;
      for (int64_t e = 0; e < hc; ++e) line[e * entry_stride] /= denom;
    }
  };
  auto normalize_columns = [&] { normalize_lines(1, hc); };
  auto normalize_rows = [&] { normalize_lines(hc, 1); };
  normalize_columns();
  for (int64_t it = 1; it < s.sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
}

// sum_h weight[h] * copy[h], the collapse of the copies of one token.
void weighted_sum(const HcShape& s, const float* stream_row, const float* weight, float* out) {
  const int64_t d = s.n_embd;
  for (int64_t i = 0; i < d; ++i) out[i] = stream_row[i] * weight[0];
  for (int64_t h = 1; h < s.hc; ++h) {
    const float* copy = stream_row + h * d;
    for (int64_t i = 0; i < d; ++i) out[i] += copy[i] * weight[h];
  }
}

void check_norm(const HcShape& s, const Tensor* norm) {
  check_shape(!norm || (norm->type == XPACK_TYPE_F32 && norm->numel() == s.n_embd),
              "hyper-connection norm is not one F32 row");
}

void check_stream(const HcShape& s, const Tensor& stream, const Tensor& mixes, int64_t mix_width, const Tensor& out) {
  check_shape(stream.width() == s.hc * s.n_embd && mixes.width() == mix_width && mixes.rows() == stream.rows() &&
                  out.width() == s.n_embd && out.rows() == stream.rows(),
              "hyper-connection shapes disagree");
}

}  // namespace

void CpuDs4Ops::hc_pre(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale,
                       const Tensor& stream, const Tensor& input, const Tensor& post, const Tensor& comb,
                       const Tensor* norm) {
  const int64_t hc = s.hc, md = (2 + hc) * hc, width = hc * s.n_embd, n = stream.rows();
  check_stream(s, stream, mixes, md, input);
  check_shape(base.numel() == md && scale.numel() == 3 && post.numel() == n * hc && comb.numel() == n * hc * hc,
              "hc_pre shapes disagree");
  check_norm(s, norm);
  const float *b = base.f32(), *sc = scale.f32();
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < n; ++t) {
    const float* m = mixes.f32() + t * md;
    const float r = rms_scale(stream.f32() + t * width, width, s.rms_eps);
    for (int64_t h = 0; h < hc; ++h) {
      pre[h] = sigmoid(m[h] * r * sc[0] + b[h]) + s.eps;
      post.f32()[t * hc + h] = 2.0f * sigmoid(m[hc + h] * r * sc[1] + b[hc + h]);
    }
    float* c = comb.f32() + t * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) c[i] = m[2 * hc + i] * r * sc[2] + b[2 * hc + i];
    sinkhorn(s, c);
    float* in = input.f32() + t * s.n_embd;
    weighted_sum(s, stream.f32() + t * width, pre.data(), in);
    if (norm) rms_norm_row(in, norm->f32(), s.n_embd, s.rms_eps, in);
  }
}

void CpuDs4Ops::hc_post(const HcShape& s, const Tensor& output, const Tensor& residual, const Tensor& post,
                        const Tensor& comb, const Tensor& stream) {
  const int64_t hc = s.hc, d = s.n_embd, width = hc * d, n = output.rows();
  check_shape(output.width() == d && residual.width() == width && stream.width() == width && residual.rows() == n &&
                  stream.rows() == n && post.numel() == n * hc && comb.numel() == n * hc * hc,
              "hc_post shapes disagree");
  std::vector<float> copy(static_cast<size_t>(hc));
  for (int64_t t = 0; t < n; ++t) {
    const float* f = output.f32() + t * d;
    const float* res = residual.f32() + t * width;
    const float* p = post.f32() + t * hc;
    const float* c = comb.f32() + t * hc * hc;
    float* out = stream.f32() + t * width;
    // Value by value, all copies read before any is written: stream may be
    // residual. Each value is f * post[dst] + copy 0 * comb[0][dst] + ..., in that order.
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t src = 0; src < hc; ++src) copy[size_t(src)] = res[src * d + i];
      for (int64_t dst = 0; dst < hc; ++dst) {
        float acc = f[i] * p[dst];
        for (int64_t src = 0; src < hc; ++src) acc += copy[size_t(src)] * c[src * hc + dst];
        out[dst * d + i] = acc;
      }
    }
  }
}

void CpuDs4Ops::hc_head(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale,
                        const Tensor& stream, const Tensor& out, const Tensor* norm) {
  const int64_t hc = s.hc, width = hc * s.n_embd;
  check_stream(s, stream, mixes, hc, out);
  check_shape(base.numel() == hc && scale.numel() == 1, "hc_head shapes disagree");
  check_norm(s, norm);
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < stream.rows(); ++t) {
    const float r = rms_scale(stream.f32() + t * width, width, s.rms_eps);
    for (int64_t h = 0; h < hc; ++h)
      pre[h] = sigmoid(mixes.f32()[t * hc + h] * r * scale.f32()[0] + base.f32()[h]) + s.eps;
    float* o = out.f32() + t * s.n_embd;
    weighted_sum(s, stream.f32() + t * width, pre.data(), o);
    if (norm) rms_norm_row(o, norm->f32(), s.n_embd, s.rms_eps, o);
  }
}

}  // namespace xrun::ds4
