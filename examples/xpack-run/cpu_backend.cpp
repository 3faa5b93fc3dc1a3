#include "cpu_backend.h"

#include <vector>

#include "xpack/xpack.h"

namespace xrun {

float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: lets the compiler vectorize while keeping
  // one fixed summation order for every call.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void parallel_for_work(int64_t n, int64_t work_per_item,
                       const std::function<void(int64_t begin, int64_t end)>& fn) {
  constexpr int64_t kInlineWork = 1 << 16;
  if (n <= 0) return;
  if (work_per_item > 0 && n <= kInlineWork / work_per_item) {
    fn(0, n);
    return;
  }
  parallel_for(n, fn);
}

void CpuBackend::matmul(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x,
                        int n_tokens, float* y) {
  const size_t rb = row_bytes(type, ne0);
  const auto* wb = static_cast<const uint8_t*>(w);
  parallel_for_work(ne1, ne0 * n_tokens, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row;
    if (type != XPACK_TYPE_F32) row.resize(static_cast<size_t>(ne0));
    for (int64_t o = begin; o < end; ++o) {
      const float* r;
      if (type == XPACK_TYPE_F32) {
        r = reinterpret_cast<const float*>(wb + static_cast<size_t>(o) * rb);
      } else {
        dequantize(type, wb + static_cast<size_t>(o) * rb, row.data(), ne0);
        r = row.data();
      }
      for (int t = 0; t < n_tokens; ++t) {
        y[static_cast<size_t>(t) * ne1 + o] = dot_f32(r, x + static_cast<size_t>(t) * ne0, ne0);
      }
    }
  });
}

}  // namespace xrun
