// CudaTensorPool (cuda_tensor_pool.h).
#include "cuda_tensor_pool.h"

#include <bit>

namespace xrun {

size_t CudaTensorPool::class_bytes(size_t bytes) {
  if (bytes <= 4096) return (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (bytes > kMaxPooledBytes) return (bytes + 255) / 256 * 256;
  // Four steps between 2^e and 2^(e+1): 2^e * {1, 1.25, 1.5, 1.75}.
  const size_t top = std::bit_floor(bytes - 1);  // bytes - 1 < 2 * top
  const size_t step = top / 4;
  return (bytes + step - 1) / step * step;
}

void* CudaTensorPool::acquire(size_t bytes, cudaError_t* error) {
  const size_t cb = class_bytes(bytes);
  *error = cudaSuccess;
  if (cb <= kMaxPooledBytes) {
    const std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cb);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= cb;
      return p;
    }
  }
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, cb, stream_);
  if (e == cudaErrorMemoryAllocation) {
    // The free lists may hold what this block needs.
    cudaGetLastError();
    trim();
    e = cudaMallocAsync(&p, cb, stream_);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    *error = e;
    return nullptr;
  }
  return p;
}

void CudaTensorPool::release(void* p, size_t bytes) {
  if (!p) return;
  const size_t cb = class_bytes(bytes);
  if (cb > kMaxPooledBytes) {
    cudaFreeAsync(p, stream_);  // stream order: after every enqueued user
    return;
  }
  const std::lock_guard<std::mutex> lock(mu_);
  free_[cb].push_back(p);
  cached_ += cb;
}

uint64_t CudaTensorPool::cached_bytes() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

void CudaTensorPool::trim() {
  const std::lock_guard<std::mutex> lock(mu_);
  for (auto& [cb, blocks] : free_)
    for (void* p : blocks) cudaFreeAsync(p, stream_);
  free_.clear();
  cached_ = 0;
}

CudaTensorPool::~CudaTensorPool() { trim(); }

}  // namespace xrun
