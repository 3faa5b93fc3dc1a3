// CpuBackend: memory, copies and the matrix products.
#include "cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "dequant.h"
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

void check_shape(bool ok, const char* what) {
  if (!ok) throw ModelError(std::string("backend: ") + what);
}

Tensor CpuBackend::alloc(uint32_t type, int64_t width, int64_t rows) {
  check_shape(width >= 0 && rows >= 0, "alloc of a negative shape");
  Tensor t;
  t.type = type;
  t.ne[0] = width;
  t.ne[1] = rows;
  // 64-byte aligned, as the vectorized loops like; never zero bytes, so every
  // tensor (also an empty one) has an address.
  const size_t bytes = (std::max<size_t>(t.nbytes(), 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw ModelError("out of memory allocating a " + std::to_string(bytes) + "-byte tensor");
  std::memset(p, 0, bytes);
  t.storage = std::shared_ptr<void>(p, std::free);
  t.data = p;
  return t;
}

Tensor CpuBackend::weight(const WeightTensor& w) { return borrowed_tensor(w.type, w.ne[0], w.rows(), w.data); }

Tensor CpuBackend::upload(uint32_t type, const void* host, int64_t width, int64_t rows) {
  Tensor t = alloc(type, width, rows);
  std::memcpy(t.data, host, t.nbytes());
  return t;
}

void CpuBackend::download(const Tensor& src, void* host) { std::memcpy(host, src.data, src.nbytes()); }

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  check_shape(src.type == dst.type && src.numel() == dst.numel(), "copy between different tensors");
  std::memmove(dst.data, src.data, src.nbytes());
}

void CpuBackend::wait_event(void* event) {
  // Host-memory expert sources hand out no events: their waits happen on the host.
  check_shape(event == nullptr, "the CPU backend cannot wait on a device event");
}

// Dequantizes one weight row at a time (F32 rows are used in place) into a
// per-thread buffer and dots it with each token's input.
void CpuBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& y) {
  check_shape(x.type == XPACK_TYPE_F32 && y.type == XPACK_TYPE_F32, "matmul needs F32 activations");
  check_shape(x.width() == w.width() && y.width() == w.rows() && x.rows() == y.rows(), "matmul shapes disagree");
  const uint32_t type = w.type;
  const int64_t ne0 = w.width(), ne1 = w.rows(), n_tokens = x.rows();
  const size_t rb = w.row_nbytes();
  const auto* wb = static_cast<const uint8_t*>(w.data);
  const float* xs = x.f32();
  float* ys = y.f32();
  pool_.parallel_for(ne1, ne0 * n_tokens, [&](int64_t begin, int64_t end) {
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
      for (int64_t t = 0; t < n_tokens; ++t) {
        ys[static_cast<size_t>(t) * ne1 + o] = dot_f32(r, xs + static_cast<size_t>(t) * ne0, ne0);
      }
    }
  });
}

void CpuBackend::get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const bool ints = out.type == XPACK_TYPE_I32;
  check_shape(ids.type == XPACK_TYPE_I32 && (out.type == XPACK_TYPE_F32 || (ints && table.type == XPACK_TYPE_I32)),
              "get_rows needs I32 ids and an F32 output (or I32 from an I32 table)");
  check_shape(out.width() == table.width() && out.rows() == ids.numel(), "get_rows shapes disagree");
  const size_t rb = table.row_nbytes();
  for (int64_t r = 0; r < ids.numel(); ++r) {
    const int32_t id = ids.i32()[r];
    check_shape(id >= 0 && id < table.rows(), "get_rows id outside the table");
    const uint8_t* src = static_cast<const uint8_t*>(table.data) + rb * size_t(id);
    if (ints) {
      std::memcpy(out.i32() + r * out.width(), src, rb);
    } else {
      dequantize(table.type, src, out.f32() + r * out.width(), out.width());
    }
  }
}

void CpuBackend::set_rows(const Tensor& src, const Tensor& ids, const Tensor& dst) {
  check_shape(src.type == XPACK_TYPE_F32 && dst.type == XPACK_TYPE_F32 && ids.type == XPACK_TYPE_I32 &&
                  src.width() == dst.width() && ids.numel() == src.rows(),
              "set_rows shapes disagree");
  for (int64_t r = 0; r < src.rows(); ++r) {
    const int32_t id = ids.i32()[r];
    check_shape(id >= 0 && id < dst.rows(), "set_rows id outside the destination");
    std::memcpy(dst.f32() + int64_t(id) * dst.width(), src.f32() + r * src.width(), sizeof(float) * size_t(src.width()));
  }
}

}  // namespace xrun
