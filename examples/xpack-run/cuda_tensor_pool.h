// The CUDA backend's memory for activations and states: device blocks kept on
// the host in free lists by size class, so that a decode step's few hundred
// temporaries cost no driver call. cudaMallocAsync and cudaFreeAsync cost the
// host several microseconds each, twice per temporary: about a millisecond of
// a deepseek4 decode step that is otherwise a few milliseconds.
//
// Why a block may be reused the moment it is released: every operation that
// touches these tensors is enqueued on the one compute stream the pool was
// made for, so whatever is enqueued after the release runs after every use
// before it. Memory that another stream reads must not come from here.
//
// Blocks come from the stream's pool (cudaMallocAsync) and go back to it only
// when an allocation fails (trim, then one retry; not while capturing) or when
// the pool is destroyed. Large blocks (a prompt's activations, grown KV caches) skip the
// free lists: their driver calls are small beside the work on them, and kept
// they would hold memory that smaller sizes cannot use.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace xrun {

class CudaTensorPool {
 public:
  explicit CudaTensorPool(cudaStream_t stream) : stream_(stream) {}
  ~CudaTensorPool();
  CudaTensorPool(const CudaTensorPool&) = delete;
  CudaTensorPool& operator=(const CudaTensorPool&) = delete;

  // Blocks of at most this many bytes are kept for reuse.
  static constexpr size_t kMaxPooledBytes = size_t(1) << 20;

  // The bytes acquire(bytes) really takes: 256-byte multiples up to 4 KiB,
  // then four classes per power of two (at most a quarter more than asked).
  static size_t class_bytes(size_t bytes);

  // A device block of at least `bytes` (0 counts as 1) for the compute stream,
  // or nullptr with the CUDA error in *error. Thread-safe.
  void* acquire(size_t bytes, cudaError_t* error);
  // Gives back a block acquire(bytes) returned, with the same `bytes`. Thread-safe.
  void release(void* p, size_t bytes);

  // Bytes in the free lists (held, not in use).
  uint64_t cached_bytes() const;
  // Hands every free block back to the stream's pool. Thread-safe.
  void trim();

  // While the compute stream is being captured into a CUDA graph nothing may
  // be allocated or freed on it (that would become part of the graph): a new
  // block is allocated on `side` (and waited for), and a large block released
  // is kept until end_capture(), which frees it on the compute stream, after
  // the graph's launch. Thread-safe.
  void begin_capture(cudaStream_t side);
  void end_capture();

 private:
  cudaStream_t stream_;
  cudaStream_t side_ = nullptr;  // non-null while capturing
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by class_bytes
  std::vector<void*> deferred_;                          // large blocks released while capturing
  uint64_t cached_ = 0;
};

}  // namespace xrun
