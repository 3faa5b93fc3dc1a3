// Helpers written once over any Backend.
#include "backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dequant.h"
#include "xpack/xpack.h"

namespace xrun {

// The reference form: one matmul per problem (what a CPU does anyway).
void Backend::grouped_matmul(const std::vector<GroupedProblem>& problems, const Tensor& x, const Tensor& y) {
  for (const GroupedProblem& p : problems) {
    if (p.rows == 0) continue;
    matmul(p.w, x.row_range(p.row, p.rows), y.row_range(p.row, p.rows));
  }
}

// The reference form: one matmul per product.
void Backend::shared_input_matmul(const Tensor& x, const std::vector<Product>& products) {
  for (const Product& p : products) matmul(*p.w, x, *p.y);
}

void Backend::start_download(const Tensor& src) {
  download_started_ = false;
  started_bytes_.resize(src.nbytes());
  download(src, started_bytes_.data());
  download_started_ = true;
}

void Backend::finish_download(void* host) {
  if (!download_started_) throw ModelError("backend: finish_download without start_download");
  download_started_ = false;
  if (!started_bytes_.empty()) std::memcpy(host, started_bytes_.data(), started_bytes_.size());
}

// The reference form: the norm over the heads seen as rows, then the rotation.
void Backend::rms_norm_rope(const Tensor& x, const Tensor* weight, float eps, const RopeSpec& spec, int64_t pos0) {
  if (spec.head_dim <= 0 || x.width() % spec.head_dim != 0)
    throw ModelError("rms_norm_rope: width " + std::to_string(x.width()) + " is not whole heads of " +
                     std::to_string(spec.head_dim));
  const Tensor heads = x.reshaped(spec.head_dim, x.numel() / spec.head_dim);
  rms_norm(heads, weight, eps, heads);
  rope(x, spec, pos0);
}

void Backend::route(const Tensor& logits, const RouteSpec& spec, const Tensor& ids, const Tensor& weights) {
  if (spec.gate) unary(*spec.gate, logits, logits);
  if (spec.select && spec.bias) {
    // The bias only steers the selection; the weights are the logits' own.
    const Tensor biased = empty(XPACK_TYPE_F32, logits.width(), logits.rows());
    add(logits, *spec.bias, biased);
    top_k(biased, ids);
  } else if (spec.select) {
    top_k(logits, ids);
  }
  take(logits, ids, weights);
  if (spec.normalize) normalize_rows(weights, spec.floor);
  if (spec.scale != 0.0f && spec.scale != 1.0f) scale(weights, spec.scale, weights);
}

void reserve_rows(Backend& be, Tensor& t, int64_t rows) {
  if (rows <= t.rows()) return;
  const int64_t old_rows = t.rows();
  Tensor grown = be.alloc(t.type, t.width(), std::max(rows, 2 * old_rows));
  if (old_rows > 0) be.copy(t, grown.row_range(0, old_rows));
  t = grown;
}

Tensor float_weight(Backend& be, const WeightTensor& w) {
  const int64_t n = w.ne[0] * w.rows();
  std::vector<float> host(static_cast<size_t>(n));
  const size_t rb = row_bytes(w.type, w.ne[0]);
  for (int64_t r = 0; r < w.rows(); ++r) {
    dequantize(w.type, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * rb, host.data() + r * w.ne[0],
               w.ne[0]);
  }
  return be.upload(XPACK_TYPE_F32, host.data(), w.ne[0], w.rows());
}

}  // namespace xrun
