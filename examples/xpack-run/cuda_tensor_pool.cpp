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
  cudaStream_t side = nullptr;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    side = side_;
    auto it = cb <= kMaxPooledBytes ? free_.find(cb) : free_.end();
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= cb;
      return p;
    }
  }
  void* p = nullptr;
  cudaError_t e = cudaSuccess;
  if (side) {
    // Allocated on the side stream and finished before the graph that uses it is launched.
    e = cudaMallocAsync(&p, cb, side);
    if (e == cudaSuccess) e = cudaStreamSynchronize(side);
  } else {
    e = cudaMallocAsync(&p, cb, stream_);
    if (e == cudaErrorMemoryAllocation) {
      // The free lists may hold what this block needs.
      cudaGetLastError();
      trim();
      e = cudaMallocAsync(&p, cb, stream_);
    }
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
  const std::lock_guard<std::mutex> lock(mu_);
  if (cb > kMaxPooledBytes) {
    if (side_)
      deferred_.push_back(p);  // its users are in the graph being captured
    else
      cudaFreeAsync(p, stream_);  // stream order: after every enqueued user
    return;
  }
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

void CudaTensorPool::begin_capture(cudaStream_t side) {
  const std::lock_guard<std::mutex> lock(mu_);
  side_ = side;
}

void CudaTensorPool::end_capture() {
  const std::lock_guard<std::mutex> lock(mu_);
  side_ = nullptr;
  for (void* p : deferred_) cudaFreeAsync(p, stream_);
  deferred_.clear();
}

CudaTensorPool::~CudaTensorPool() {
  end_capture();
  trim();
}

}  // namespace xrun
