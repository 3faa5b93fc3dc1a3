// A tensor of a compute backend: a ggml type, a shape and the address of its
// bytes in the backend's memory (a device address on a GPU backend; on the CPU
// host memory, possibly a view of the mapped trunk GGUF). A Tensor is a handle:
// copies share the bytes, and an operation writes through the handle it is given.
//
// Layout (ggml's): ne[0] is contiguous. An activation is [rows][width] with
// ne[0] = width, ne[1] = rows; a weight matrix has ne[0] = inputs, ne[1] = outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace xrun {

struct Tensor {
  uint32_t type = 0;             // enum xpack_ggml_type
  int64_t ne[4] = {1, 1, 1, 1};
  void* data = nullptr;          // backend address
  std::shared_ptr<void> storage; // owns `data` for allocations; shared by views, empty for borrowed bytes

  int64_t width() const { return ne[0]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t numel() const { return ne[0] * rows(); }
  size_t row_nbytes() const;
  size_t nbytes() const { return row_nbytes() * static_cast<size_t>(rows()); }
  // Rows [first, first + n) as a 2-D tensor sharing these bytes.
  Tensor row_range(int64_t first, int64_t n) const;
  // The same bytes seen as [rows][width] (width * rows must equal numel()).
  Tensor reshaped(int64_t width, int64_t rows) const;
  // The typed address, for backend implementations (host memory only on the
  // CPU backend: graphs read results through Backend::download).
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
};

// A tensor over bytes someone else owns (a mapping, an expert cache entry).
Tensor borrowed_tensor(uint32_t type, int64_t ne0, int64_t ne1, const void* data);

}  // namespace xrun
