// What the decode kernels' launches share (quant_matvec.cu, mxfp4_mmv.cu): the
// problems of one launch as the kernel's parameter, and two host-side caches.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "quant_matmul.h"

namespace xpack::kernels::dev {

struct GroupParams {
  int n;
  const uint8_t* w[kMaxGroupedProblems];
  int32_t row[kMaxGroupedProblems];
  int32_t ntok[kMaxGroupedProblems];
  // Products of one input (shared_input_matvec): problem p has ne1[p] rows and
  // writes y[p]; 0: the launch's ne1 and y for every problem (experts).
  int shared;
  float* y[kMaxSharedInputProducts];
  int32_t ne1[kMaxSharedInputProducts];
  // x as the dp4a units read it, made once for the launch by stage_terms_kernel
  // (null: each block makes its own): token t of problem p at row trow[p] + t,
  // Ty::kXs * 4 bytes a unit.
  const uint8_t* terms;
  int32_t trow[kMaxGroupedProblems];
};
static_assert(sizeof(GroupParams) <= 4096, "a kernel parameter of the 4 KB every CUDA version takes");

// Products of one input (gp.shared) number their groups of `rows` rows product
// after product: the launch's groups, and the product group g falls in (g becomes
// its index within that product; a g past the last product's groups stays in it).
__host__ __device__ inline int shared_groups(const GroupParams& gp, int rows) {
  int n = 0;
  for (int q = 0; q < gp.n; ++q) n += (gp.ne1[q] + rows - 1) / rows;
  return n;
}
__device__ inline int shared_product(const GroupParams& gp, int rows, int& g) {
  int q = 0;
  for (; q + 1 < gp.n; ++q) {
    const int n = (gp.ne1[q] + rows - 1) / rows;
    if (g < n) break;
    g -= n;
  }
  return q;
}

// An attribute of the current device, cached per device (0: unknown): the query
// costs the host microseconds, and launches ask for it every time.
template <cudaDeviceAttr kAttr>
inline int device_attribute() {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0 && cudaDeviceGetAttribute(&n, kAttr, dev) == cudaSuccess) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}
inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }
inline size_t l2_bytes() { return size_t(device_attribute<cudaDevAttrL2CacheSize>()); }

// Blocks of one kernel per SM at a dynamic shared-memory size, remembered per size
// (16 of them: shapes alternate between a few input widths, and the query costs the
// host microseconds per launch). Lock-free; a lost race only repeats the query.
struct OccupancyCache {
  std::atomic<uint64_t> entry[16] = {};  // (smem + 1) << 8 | blocks; 0 = empty
  template <class K>
  int blocks(K* kernel, int threads, size_t smem) {
    const uint64_t key = uint64_t(smem) + 1;
    for (auto& e : entry) {
      const uint64_t v = e.load(std::memory_order_relaxed);
      if (v == 0) break;
      if ((v >> 8) == key) return int(v & 0xFF);
    }
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    const uint64_t v = (key << 8) | uint64_t(std::min(n, 255));
    for (auto& e : entry) {
      uint64_t cur = 0;
      if (e.compare_exchange_strong(cur, v, std::memory_order_relaxed) || (cur >> 8) == key) break;
    }
    return n;
  }
};

// The tensor-core kernel's blocks of threads: warps a tile of 16 rows x tiles a
// block (mxfp4_mmv.cu). The warps a tile split each row's sum, so the layout
// orders it: set_matvec_geometry's for every launch, or kAuto (the default): each
// problem's by its own shape and token count (quant_matvec.cu, mma_layout_for).
enum class MmaLayout { k4x2 = 0, k4x4 = 1, k8x2 = 2, k16x1 = 3, kAuto = 4 };

// The tensor-core decode's choices (set_matvec_geometry's): device memory it may
// make a launch's x in once (a context's scratch; buf null: none), and when
// (kPrestageAuto, kPrestageAlways, kPrestageNever); whether from two tokens on a
// block and pair of tokens takes one product or two (the same bits); whether a
// launch may run sliced (set_mma_slices: kSwitch*; the same bits).
struct MmaOptions {
  uint8_t* buf;
  size_t bytes;
  int prestage;
  bool one_product;
  int slices;
};

// Where kPrestageAuto makes a launch's x once, for the dp4a units (quant_matvec.cu)
// and the tensor cores (mxfp4_mmv.cu) alike: from two tokens on, and at one token
// for rows of kPrestageMinInputs and more, where each kernel measured it faster.
constexpr int kPrestageMinInputs = 8192;
inline bool prestage_pays(int nt_max, int ne0) { return nt_max > 1 || ne0 >= kPrestageMinInputs; }

// The MXFP4 decode on the int8 tensor cores (mxfp4_mmv.cu), for the shapes the
// unsplit kernel takes; x and y as that kernel's. cudaErrorNotSupported, nothing
// launched, where the device cannot run it.
cudaError_t launch_mxfp4_mmv(const GroupParams& gp, int ne0, int ne1, size_t row_bytes, const float* x, float* y,
                             int nt_max, MmaLayout layout, bool shared_wave, const MmaOptions& st, cudaStream_t stream);

// Q2_K and Q3_K decode on the int8 tensor cores (kquant_mmv.cu), x staged in
// `stage` (kq_stage_bytes a problem, 16-byte aligned) for each launch of as many
// problems as it holds; x and y as the unsplit kernel's. cudaErrorNotSupported,
// nothing launched, where it cannot hold one problem's.
size_t kq_stage_bytes(int64_t ne0, int nt_max);
cudaError_t launch_kq_mmv(uint32_t type, const GroupParams& gp, int ne0, int ne1, size_t row_bytes, const float* x,
                          float* y, int nt_max, uint8_t* stage, size_t stage_bytes, cudaStream_t stream);

}  // namespace xpack::kernels::dev
