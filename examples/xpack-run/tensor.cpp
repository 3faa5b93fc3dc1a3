#include "tensor.h"

#include "dequant.h"
#include "weights.h"

namespace xrun {

size_t Tensor::row_nbytes() const { return row_bytes(type, ne[0]); }

Tensor Tensor::row_range(int64_t first, int64_t n) const {
  if (first < 0 || n < 0 || first + n > rows()) {
    throw ModelError("tensor rows [" + std::to_string(first) + ", " + std::to_string(first + n) +
                     ") outside its " + std::to_string(rows()) + " rows");
  }
  Tensor v = *this;
  v.ne[1] = n;
  v.ne[2] = v.ne[3] = 1;
  v.data = static_cast<uint8_t*>(data) + static_cast<size_t>(first) * row_nbytes();
  return v;
}

Tensor Tensor::reshaped(int64_t width, int64_t n_rows) const {
  if (width * n_rows != numel()) throw ModelError("tensor reshape changes the element count");
  Tensor v = *this;
  v.ne[0] = width;
  v.ne[1] = n_rows;
  v.ne[2] = v.ne[3] = 1;
  return v;
}

Tensor borrowed_tensor(uint32_t type, int64_t ne0, int64_t ne1, const void* data) {
  Tensor t;
  t.type = type;
  t.ne[0] = ne0;
  t.ne[1] = ne1;
  // Weights are only ever read by operations; the handle type is shared with outputs.
  t.data = const_cast<void*>(data);
  return t;
}

}  // namespace xrun
