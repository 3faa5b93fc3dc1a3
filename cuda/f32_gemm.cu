// The fp32 product of f32_gemm.h: 64 x 64 output tiles over 256 threads, each
// thread 4 rows x 4 tokens, through shared memory 32 inputs at a time; split
// over the inputs where the tiles alone would leave most of the GPU idle.
#include "f32_gemm.h"

#include <algorithm>

#include "quant_matmul.h"

namespace xpack::kernels::dev {
namespace {

constexpr int kTile = 64, kK = 32, kThreads = 256;
// One row of 65 words: a warp's 32 stores of one input across rows, and its
// loads of 16 consecutive rows, meet 32 (16) different banks.
constexpr int kPad = kTile + 1;
// At least this many inputs per part: fewer make the partial sums' traffic
// larger than the product's.
constexpr int64_t kMinSplitInputs = 512;
constexpr int kMaxSplits = 64;

// Tile (blockIdx.x: rows, blockIdx.y: tokens), part blockIdx.z of the inputs
// [k_begin, k_end). Thread (tx, ty) = (tid % 16, tid / 16) owns rows tx + 16i
// and tokens ty + 16j, i, j < 4.
__global__ void __launch_bounds__(kThreads) gemm_kernel(const float* __restrict__ w, int64_t ne0, int64_t ne1,
                                                        const float* __restrict__ x, int64_t n, int64_t part_len,
                                                        float* __restrict__ out) {
  __shared__ float ws[kK][kPad];
  __shared__ float xs[kK][kPad];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t r0 = int64_t(blockIdx.x) * kTile, t0 = int64_t(blockIdx.y) * kTile;
  const int64_t k_begin = int64_t(blockIdx.z) * part_len;
  const int64_t k_end = k_begin + part_len < ne0 ? k_begin + part_len : ne0;
  // Loads: lane -> input k0 + (tid % 32), warp -> rows (tokens) tid / 32 + 8i.
  const int lk = tid % 32, lr = tid / 32;
  float acc[4][4] = {};
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kK) {
    const int64_t k = k0 + lk;
    const bool k_ok = k < k_end;
#pragma unroll
    for (int i = 0; i < kTile / 8; ++i) {
      const int64_t r = r0 + lr + 8 * i, t = t0 + lr + 8 * i;
      ws[lk][lr + 8 * i] = k_ok && r < ne1 ? __ldg(w + r * ne0 + k) : 0.0f;
      xs[lk][lr + 8 * i] = k_ok && t < n ? __ldg(x + t * ne0 + k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = ws[kk][tx + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = xs[kk][ty + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* o = out + int64_t(blockIdx.z) * n * ne1;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t t = t0 + ty + 16 * j;
    if (t >= n) continue;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = r0 + tx + 16 * i;
      if (r < ne1) o[t * ne1 + r] = acc[i][j];
    }
  }
}

// y = the parts' sums added in part order.
__global__ void sum_parts_kernel(const float* __restrict__ parts, int splits, int64_t count, float* __restrict__ y) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    float s = parts[e];
    for (int p = 1; p < splits; ++p) s += parts[int64_t(p) * count + e];
    y[e] = s;
  }
}

}  // namespace

int f32_gemm(const float* w, int64_t ne0, int64_t ne1, const float* x, int64_t n, float* y, float* scratch,
             size_t scratch_bytes, cudaStream_t stream) {
  if (n <= 0 || ne1 <= 0) return kOk;
  const int64_t row_tiles = (ne1 + kTile - 1) / kTile, tok_tiles = (n + kTile - 1) / kTile;
  if (row_tiles > 0x7FFFFFFF || tok_tiles > 65535) return kErrShape;
  int sms = 0, dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return kErrCuda;
  // Parts: enough blocks for two per SM, each part at least kMinSplitInputs
  // long, all parts' sums within the scratch.
  const int64_t tiles = row_tiles * tok_tiles;
  int64_t splits = std::min<int64_t>((2 * int64_t(sms) + tiles - 1) / tiles, ne0 / kMinSplitInputs);
  splits = std::min<int64_t>(splits, kMaxSplits);
  const size_t part_bytes = size_t(n) * size_t(ne1) * sizeof(float);
  if (scratch) splits = std::min<int64_t>(splits, int64_t(scratch_bytes / part_bytes));
  else splits = 1;
  if (splits < 2) splits = 1;
  // Parts of whole kK steps, so that a part's sums follow the same steps as an unsplit one's.
  const int64_t part_len = splits == 1 ? ne0 : ((ne0 + splits - 1) / splits + kK - 1) / kK * kK;
  splits = (ne0 + part_len - 1) / part_len;
  const dim3 grid{unsigned(row_tiles), unsigned(tok_tiles), unsigned(splits)};
  gemm_kernel<<<grid, kThreads, 0, stream>>>(w, ne0, ne1, x, n, part_len, splits == 1 ? y : scratch);
  if (cudaGetLastError() != cudaSuccess) return kErrCuda;
  if (splits > 1) {
    const int64_t count = n * ne1;
    const unsigned blocks = unsigned(std::min<int64_t>((count + 255) / 256, 4096));
    sum_parts_kernel<<<blocks, 256, 0, stream>>>(scratch, int(splits), count, y);
    if (cudaGetLastError() != cudaSuccess) return kErrCuda;
  }
  return kOk;
}

}  // namespace xpack::kernels::dev
