// deepseek4's compressor pooling, lightning indexer and attention core on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../../cpu_backend.h"
#include "ds4_ops_cpu.h"
#include "xpack/xpack.h"

namespace xrun::ds4 {

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Blocks of `ratio` positions that a query at `pos` may see, of n_blocks made.
int64_t visible_blocks(int64_t pos, int64_t ratio, int64_t n_blocks) { return std::min((pos + 1) / ratio, n_blocks); }

}  // namespace

void CpuDs4Ops::compress_pool(const Tensor& kv, const Tensor& score, int64_t rows_first, int64_t first_block,
                              int64_t ratio, bool overlap, const Tensor& out) {
  const int64_t width = out.width(), row_width = overlap ? 2 * width : width;
  check_shape(kv.width() == row_width && score.width() == row_width && kv.rows() == score.rows(),
              "compress_pool shapes disagree");
  const int64_t n_entries = overlap ? 2 * ratio : ratio;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> values(static_cast<size_t>(n_entries)), scores(static_cast<size_t>(n_entries));
  for (int64_t ob = 0; ob < out.rows(); ++ob) {
    const int64_t b = first_block + ob;
    for (int64_t c = 0; c < width; ++c) {
      // This channel's entries: [previous block, first half | own block, second
      // half] when overlapping, else just the own block.
      for (int64_t j = 0; j < n_entries; ++j) {
        int64_t pos, col;
        if (overlap && j < ratio) {
          pos = (b - 1) * ratio + j;
          col = c;
        } else {
          pos = b * ratio + (overlap ? j - ratio : j);
          col = overlap ? width + c : c;
        }
        if (pos < 0) {  // before the sequence: contributes nothing
          values[j] = 0.0f;
          scores[j] = neg_inf;
        } else {
          const int64_t r = pos - rows_first;
          check_shape(r >= 0 && r < kv.rows(), "compress_pool: a pooled row is no longer kept");
          values[j] = kv.f32()[r * row_width + col];
          scores[j] = score.f32()[r * row_width + col];
        }
      }
      softmax_row(scores.data(), n_entries);
      double sum = 0.0;
      for (int64_t j = 0; j < n_entries; ++j) sum += static_cast<double>(values[j] * scores[j]);
      out.f32()[ob * width + c] = static_cast<float>(sum);
    }
  }
}

void CpuDs4Ops::indexer_select(const Tensor& q, const Tensor& w, const Tensor& keys, int64_t n_head, int64_t pos0,
                               int64_t ratio, const Tensor& chosen) {
  const int64_t id = keys.width(), top_k = chosen.width(), n = q.rows();
  check_shape(q.width() == n_head * id && w.width() == n_head && w.rows() == n && chosen.rows() == n &&
                  chosen.type == XPACK_TYPE_I32,
              "indexer_select shapes disagree");
  for (int64_t t = 0; t < n; ++t) {
    int32_t* out = chosen.i32() + t * top_k;
    std::fill(out, out + top_k, -1);
    const int64_t n_visible = visible_blocks(pos0 + t, ratio, keys.rows());
    if (n_visible <= top_k) {
      for (int64_t b = 0; b < n_visible; ++b) out[b] = static_cast<int32_t>(b);
      continue;
    }
    // score(b) = sum_h w_h * relu(q_h . k_b): the indexer's cheap relevance.
    const float* qt = q.f32() + t * n_head * id;
    const float* wt = w.f32() + t * n_head;
    std::vector<float> score(static_cast<size_t>(n_visible));
    for (int64_t b = 0; b < n_visible; ++b) {
      const float* k = keys.f32() + b * id;
      double s = 0.0;
      for (int64_t h = 0; h < n_head; ++h) s += static_cast<double>(std::max(0.0f, dot(qt + h * id, k, id)) * wt[h]);
      score[b] = static_cast<float>(s);
    }
    std::vector<int64_t> order(static_cast<size_t>(n_visible));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int64_t a, int64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
    std::sort(order.begin(), order.begin() + top_k);
    for (int64_t j = 0; j < top_k; ++j) out[j] = static_cast<int32_t>(order[j]);
  }
}

void CpuDs4Ops::attention(const Tensor& q, const Tensor& raw, int64_t raw_first, int64_t window,
                          const Tensor* blocks, int64_t ratio, const Tensor* chosen, const Tensor& sinks,
                          int64_t pos0, const Tensor& out) {
  const int64_t hd = raw.width(), nh = sinks.numel(), n = q.rows();
  check_shape(q.width() == nh * hd && out.width() == q.width() && out.rows() == n &&
                  (!blocks || blocks->width() == hd) && (!chosen || (chosen->rows() == n && blocks)),
              "deepseek4 attention shapes disagree");
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  pool_.parallel_for(n, 0, [&](int64_t begin, int64_t end) {
    std::vector<const float*> keys;
    std::vector<float> p;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = pos0 + t;
      const int64_t raw_lo = std::max(raw_first, pos - window + 1);
      check_shape(pos - raw_first < raw.rows(), "deepseek4 attention: the query's own key is missing");
      keys.clear();
      for (int64_t j = raw_lo; j <= pos; ++j) keys.push_back(raw.f32() + (j - raw_first) * hd);
      if (chosen) {
        for (int64_t j = 0; j < chosen->width(); ++j) {
          const int32_t b = chosen->i32()[t * chosen->width() + j];
          if (b >= 0) keys.push_back(blocks->f32() + int64_t(b) * hd);
        }
      } else if (blocks) {
        const int64_t n_visible = visible_blocks(pos, ratio, blocks->rows());
        for (int64_t b = 0; b < n_visible; ++b) keys.push_back(blocks->f32() + b * hd);
      }
      const int64_t n_keys = static_cast<int64_t>(keys.size());
      p.resize(keys.size());
      for (int64_t h = 0; h < nh; ++h) {
        const float* qh = q.f32() + t * nh * hd + h * hd;
        // Softmax over the keys plus the sink logit, which only absorbs mass.
        const float sink = sinks.f32()[h];
        float mx = sink;
        for (int64_t j = 0; j < n_keys; ++j) {
          p[j] = dot(qh, keys[j], hd) * kq_scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        sum += std::exp(sink - mx);
        const float inv = static_cast<float>(1.0 / sum);
        float* oh = out.f32() + t * nh * hd + h * hd;
        std::fill(oh, oh + hd, 0.0f);
        for (int64_t j = 0; j < n_keys; ++j) {
          const float pj = p[j] * inv;
          const float* v = keys[j];
          for (int64_t i = 0; i < hd; ++i) oh[i] += pj * v[i];
        }
      }
    }
  });
}

}  // namespace xrun::ds4
