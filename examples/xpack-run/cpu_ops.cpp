// CpuBackend: the elementwise, normalization, rotation, routing and attention
// operations. Loops keep the summation orders of ggml's CPU reference.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu_backend.h"
#include "xpack/xpack.h"

namespace xrun {

namespace {

bool is_f32(const Tensor& t) { return t.type == XPACK_TYPE_F32; }
bool same_shape(const Tensor& a, const Tensor& b) { return a.width() == b.width() && a.rows() == b.rows(); }

}  // namespace

void softmax_row(float* v, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, v[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - mx);
    sum += v[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) v[i] *= inv;
}


void CpuBackend::rms_norm(const Tensor& x, const Tensor* weight, float eps, const Tensor& y) {
  check_shape(is_f32(x) && is_f32(y) && same_shape(x, y), "rms_norm shapes disagree");
  const int64_t n = x.width();
  check_shape(!weight || (is_f32(*weight) && weight->numel() == n), "rms_norm weight is not one F32 row");
  const float* w = weight ? weight->f32() : nullptr;
  for (int64_t r = 0; r < x.rows(); ++r) rms_norm_row(x.f32() + r * n, w, n, eps, y.f32() + r * n);
}

float rms_scale(const float* x, int64_t n, float eps) {
  // Float squares summed in double, then one float scale: ggml's order.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  return 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
}

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float scale = rms_scale(x, n, eps);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * scale;
    y[i] = w ? v * w[i] : v;
  }
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_shape(is_f32(a) && is_f32(b) && is_f32(out) && same_shape(a, out), "add shapes disagree");
  check_shape(b.width() == a.width() && (b.rows() == a.rows() || b.rows() == 1), "add: b is neither a's shape nor one row");
  const int64_t w = a.width();
  for (int64_t r = 0; r < a.rows(); ++r) {
    const float* ar = a.f32() + r * w;
    const float* br = b.f32() + (b.rows() == 1 ? 0 : r * w);
    float* o = out.f32() + r * w;
    for (int64_t i = 0; i < w; ++i) o[i] = ar[i] + br[i];
  }
}

void CpuBackend::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_shape(is_f32(a) && is_f32(b) && is_f32(out) && same_shape(a, b) && same_shape(a, out), "mul shapes disagree");
  for (int64_t i = 0; i < a.numel(); ++i) out.f32()[i] = a.f32()[i] * b.f32()[i];
}

void CpuBackend::l2_norm(const Tensor& x, float eps, const Tensor& y) {
  check_shape(is_f32(x) && is_f32(y) && same_shape(x, y), "l2_norm shapes disagree");
  const int64_t n = x.width();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.f32() + r * n;
    float* yr = y.f32() + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float scale = 1.0f / std::fmax(std::sqrt(static_cast<float>(sum)), eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale;
  }
}

void CpuBackend::scale(const Tensor& x, float s, const Tensor& out) {
  check_shape(is_f32(x) && is_f32(out) && x.numel() == out.numel(), "scale shapes disagree");
  for (int64_t i = 0; i < x.numel(); ++i) out.f32()[i] = x.f32()[i] * s;
}

void CpuBackend::unary(Unary f, const Tensor& x, const Tensor& out) {
  check_shape(is_f32(x) && is_f32(out) && x.numel() == out.numel(), "unary shapes disagree");
  const float* in = x.f32();
  float* o = out.f32();
  switch (f) {
    case Unary::sigmoid:
      for (int64_t i = 0; i < x.numel(); ++i) o[i] = sigmoid(in[i]);
      break;
    case Unary::sqrt_softplus:
      for (int64_t i = 0; i < x.numel(); ++i) o[i] = std::sqrt(in[i] > 20.0f ? in[i] : std::log1p(std::exp(in[i])));
      break;
  }
}

void CpuBackend::rope(const Tensor& x, const RopeSpec& spec, int64_t pos0, int64_t pos_step, bool inverse) {
  const int64_t D = spec.head_dim, n_dims = spec.angles.n_dims;
  check_shape(is_f32(x) && D > 0 && x.width() % D == 0 && n_dims <= D && n_dims % 2 == 0,
              "rope: width is not whole heads");
  const int64_t n_heads = x.width() / D, offset = spec.tail ? D - n_dims : 0;
  std::vector<float> cache(static_cast<size_t>(n_dims));
  for (int64_t t = 0; t < x.rows(); ++t) {
    rope_yarn_cache(spec.angles, pos0 + t * pos_step, inverse, cache.data());
    float* row = x.f32() + t * x.width();
    for (int64_t h = 0; h < n_heads; ++h) rope_yarn_apply(cache.data(), static_cast<int>(n_dims), row + h * D + offset);
  }
}

void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, float limit, const Tensor& out) {
  check_shape(is_f32(gate) && is_f32(up) && is_f32(out) && same_shape(gate, up) && same_shape(gate, out),
              "swiglu shapes disagree");
  const bool clamp = limit > 1e-6f;
  const int64_t n = gate.numel();
  const float *g = gate.f32(), *u = up.f32();
  float* o = out.f32();
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i], ui = u[i];
    if (clamp) {
      gi = std::min(gi, limit);
      ui = std::min(std::max(ui, -limit), limit);
    }
    o[i] = silu(gi) * ui;
  }
}

void CpuBackend::softmax_rows(const Tensor& x) {
  check_shape(is_f32(x), "softmax_rows needs F32");
  const int64_t n = x.width();
  for (int64_t r = 0; r < x.rows(); ++r) softmax_row(x.f32() + r * n, n);
}

void CpuBackend::top_k(const Tensor& scores, const Tensor& ids) {
  const int64_t n = scores.width(), k = ids.width();
  check_shape(is_f32(scores) && ids.type == XPACK_TYPE_I32 && ids.rows() == scores.rows() && k <= n,
              "top_k shapes disagree");
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < scores.rows(); ++r) {
    const float* s = scores.f32() + r * n;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    std::copy_n(order.begin(), k, ids.i32() + r * k);
  }
}

void CpuBackend::take(const Tensor& values, const Tensor& ids, const Tensor& out) {
  check_shape(is_f32(values) && ids.type == XPACK_TYPE_I32 && is_f32(out) && same_shape(ids, out) &&
                  ids.rows() == values.rows(),
              "take shapes disagree");
  const int64_t k = ids.width(), n = values.width();
  for (int64_t r = 0; r < ids.rows(); ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = ids.i32()[r * k + j];
      check_shape(id >= 0 && id < n, "take: id outside the row");
      out.f32()[r * k + j] = values.f32()[r * n + id];
    }
  }
}

void CpuBackend::normalize_rows(const Tensor& x, float floor) {
  check_shape(is_f32(x), "normalize_rows needs F32");
  const int64_t k = x.width();
  for (int64_t r = 0; r < x.rows(); ++r) {
    float* v = x.f32() + r * k;
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += v[j];
    const float denom = std::max(static_cast<float>(sum), floor);
    for (int64_t j = 0; j < k; ++j) v[j] /= denom;
  }
}

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_head_kv,
                           int64_t pos0, float scale, const Tensor& out) {
  check_shape(n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0 && q.width() % n_head == 0,
              "attention head counts disagree");
  const int64_t D = q.width() / n_head, q_w = q.width(), kv_w = n_head_kv * D, n = q.rows();
  check_shape(is_f32(q) && is_f32(k) && is_f32(v) && is_f32(out) && same_shape(q, out) && same_shape(k, v) &&
                  k.width() == kv_w && k.rows() == pos0 + n,
              "attention shapes disagree");
  const int64_t n_kv = k.rows(), group = n_head / n_head_kv;
  pool_.parallel_for(n * n_head, n_kv * D * 2, [&](int64_t begin, int64_t end) {
    std::vector<float> score(static_cast<size_t>(n_kv));
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / n_head, h = job % n_head, hk = h / group;
      const float* qh = q.f32() + t * q_w + h * D;
      const int64_t visible = pos0 + t + 1;  // causal: keys 0..pos0+t
      for (int64_t j = 0; j < visible; ++j) {
        const float* kj = k.f32() + j * kv_w + hk * D;
        float s = 0.0f;
        for (int64_t d = 0; d < D; ++d) s += qh[d] * kj[d];
        score[size_t(j)] = s * scale;
      }
      softmax_row(score.data(), visible);
      float* oh = out.f32() + t * q_w + h * D;
      std::fill(oh, oh + D, 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        const float* vj = v.f32() + j * kv_w + hk * D;
        const float pj = score[size_t(j)];
        for (int64_t d = 0; d < D; ++d) oh[d] += pj * vj[d];
      }
    }
  });
}

void CpuBackend::combine_picks(const Tensor& ys, const Tensor& rows, const Tensor& weights, int64_t k,
                               bool accumulate, const Tensor& out) {
  const int64_t d = out.width(), n = out.rows();
  check_shape(is_f32(ys) && is_f32(out) && ys.width() == d && rows.type == XPACK_TYPE_I32 && rows.numel() == n * k &&
                  is_f32(weights) && weights.numel() == n * k && k > 0,
              "combine_picks shapes disagree");
  for (int64_t p = 0; p < n * k; ++p)
    check_shape(rows.i32()[p] >= 0 && rows.i32()[p] < ys.rows(), "combine_picks: a pick's row is outside ys");
  std::vector<float> acc(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const float* y = ys.f32() + int64_t(rows.i32()[t * k + j]) * d;
      const float w = weights.f32()[t * k + j];
      for (int64_t i = 0; i < d; ++i) {
        const float v = y[i] * w;
        acc[size_t(i)] = j == 0 ? v : acc[size_t(i)] + v;
      }
    }
    float* o = out.f32() + t * d;
    if (accumulate) {
      for (int64_t i = 0; i < d; ++i) o[i] = acc[size_t(i)] + o[i];
    } else {
      std::copy_n(acc.data(), d, o);
    }
  }
}

}  // namespace xrun
