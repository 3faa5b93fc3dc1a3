// The GPU check every CUDA test case starts with.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "skip.h"

namespace xpack::test::gpu {

// True with a usable CUDA device; otherwise records the skip
// (Absent::kCapability) naming why, and the case should return.
inline bool available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return true;
  skip(Absent::kCapability, std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
  return false;
}

}  // namespace xpack::test::gpu
