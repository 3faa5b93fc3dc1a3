// Hook through which a device backend pins the staging arena for DMA (the CUDA
// backend implements it with cudaHostRegister / cudaHostUnregister). The I/O
// engine allocates the memory as anonymous mmap (io_uring refuses to register
// cudaHostAlloc mappings on some kernels: EOPNOTSUPP), then hands the range to
// the registrar, then registers it with io_uring, so the same bytes serve both.
#pragma once
#include <cstddef>

#include "common/result.h"

namespace xpack::io {

class HostMemoryRegistrar {
 public:
  virtual ~HostMemoryRegistrar() = default;
  // Called once per arena after allocation; base is 4096-aligned.
  virtual Status register_host(void* base, size_t bytes) = 0;
  // Called before the arena is unmapped, only if register_host succeeded.
  virtual void unregister_host(void* base) = 0;
};

}  // namespace xpack::io
