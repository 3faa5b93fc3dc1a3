// WORK IN PROGRESS (branch wip/kq-mma): Q2_K and Q3_K decode (1..8 tokens) on the
// int8 tensor cores, a first form to be measured and then laid out as mxfp4_mmv.cu
// is (weights through shared memory). Here a block of threads takes a tile of 16
// rows, its warps splitting the row's blocks; each loads its A words straight from
// the rows and its B fragments from x staged once for the launch in the scratch (in
// L2: 1.3 KB a 32-input chunk at eight tokens). The pieces and their bounds:
// kquant_mma.cuh.
//
// x has one power of two a 256-input block, so a block's chunk products add as
// integers in the mma's C (the scales carried by A: kquant_mma.cuh) and become floats
// once a block. In SASS (sm_90, loop instructions a 256-input block of a tile, and
// lane-instructions a weight):
// - Q2_K: 438 at eight tokens (3.4; with a power of two a chunk, ec4b4e0: 9.9), 342
//   at one (2.7; its dp4a unit 2.55).
// - Q3_K: 756 at eight (5.9; with each sub-block's D scaled by IMAD, 1c60204: 848),
//   593 at one (4.6; by IMAD 498; its dp4a unit 3.3). Most of it is IMAD, LOP3, SHF
//   and PRMT making A: v from two halfword pairs, then three products a word.
// Next: the weights through shared memory (cp.async), so that a word at a 2-byte
// offset is two aligned shared reads and a funnel shift; then a GPU run against the
// dp4a units (bench-kernels --kq-mma, --kq-split for the split's width).
//
// Each warp's sum runs over its blocks in ascending order and the warps' are added in
// warp order, each chunk's products per pair of tokens independent of the other
// tokens' columns: a token's bits do not depend on the token count, the grid or the
// other rows.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kquant_mma.cuh"
#include "matvec_launch.cuh"

namespace xpack::kernels::dev {
namespace {

// A block of threads is one tile of 16 rows; its warps split the row's 256-input
// blocks, warp w taking those u with u % warps == w in ascending order, and their
// sums are added in warp order. The warp count is split_warps(ne0)'s, a function of
// the row length alone (and of set_kq_mmv_split's cap, the same for every launch),
// so a token's bits depend on neither the token count nor the grid. Splitting keeps
// SMs busy on the experts' few tiles: 2048 rows are 128 tiles, on 132 SMs.
constexpr int kTileRows = 16;
constexpr int kMaxSplit = 16;
std::atomic<int> g_split_cap{kMaxSplit};

int split_warps(int64_t ne0) {
  return int(std::min<int64_t>(ne0 / 256, g_split_cap.load(std::memory_order_relaxed)));
}

// The scratch for nt tokens (rounded up to 1, 2, 4, 8) of rows of ne0 inputs: the
// staged pieces (256 bytes a chunk and pair of tokens), the blocks' units, and (Q3_K)
// their sums of each term, 4 ints a block and token.
struct Staged {
  int nt, pairs, chunks;
  size_t piece_bytes, unit_bytes, sum_bytes;
  Staged(int64_t ne0, int nt_) : nt(nt_), pairs((nt_ + 1) / 2), chunks(int(ne0 / 32)) {
    piece_bytes = size_t(chunks) * size_t(pairs) * 256;
    unit_bytes = size_t(chunks / 8) * size_t(nt) * 4;  // a power of two a 256-input block
    sum_bytes = size_t(chunks / 8) * size_t(nt) * 16;
  }
  size_t bytes() const { return piece_bytes + unit_bytes + sum_bytes; }
};

int rounded_tokens(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

// One warp a (256-input block, token): its 8 chunks into the staged pieces (tokens
// past the real ones repeat the last, as the other decode kernels do).
template <int NT>
__global__ void __launch_bounds__(256) kq_stage_kernel(const float* __restrict__ x, int ne0, int n_tokens,
                                                       uint8_t* __restrict__ pieces, float* __restrict__ units,
                                                       int* __restrict__ sums) {
  constexpr int kPairs = (NT + 1) / 2;
  const int blocks = ne0 / 256;
  for (int item = int(blockIdx.x * 8 + (threadIdx.x >> 5)); item < blocks * NT; item += int(gridDim.x) * 8) {
    const int b = item / NT, t = item - b * NT;
    kq::stage_block(x + size_t(min(t, n_tokens - 1)) * size_t(ne0) + size_t(b) * 256,
                    pieces + size_t(8 * b) * kPairs * 256 + size_t(t) * 128, size_t(kPairs) * 256,
                    units + size_t(item), sums ? sums + size_t(item) * 4 : nullptr);
  }
}

template <uint32_t kType, int NT>
__global__ void __launch_bounds__(32 * kMaxSplit) kq_mmv_kernel(const uint8_t* __restrict__ W, int ne0, int ne1,
                                                                 size_t row_bytes, int n_tokens,
                                                                 const uint8_t* __restrict__ pieces,
                                                                 const float* __restrict__ units,
                                                                 const int* __restrict__ sums, float* __restrict__ y) {
  constexpr int kPairs = (NT + 1) / 2, kValues = 2 * kPairs;
  constexpr size_t kBlock = kType == kQ2_K ? 84 : 110;
  __shared__ float red[kMaxSplit][kValues][32];
  const int lane = int(threadIdx.x & 31), g = lane >> 2, c = lane & 3;
  const int warp = int(threadIdx.x >> 5), warps = int(blockDim.x >> 5);
  const int blocks = ne0 / 256, tiles = (ne1 + kTileRows - 1) / kTileRows;
  for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
    const int o0 = tile * kTileRows;
    const uint8_t* rowa = W + size_t(min(o0 + g, ne1 - 1)) * row_bytes;
    const uint8_t* rowb = W + size_t(min(o0 + g + 8, ne1 - 1)) * row_bytes;
    float acc[kPairs][2];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) acc[p][0] = acc[p][1] = 0.0f;
    for (int u = warp; u < blocks; u += warps) {
      const uint8_t* ba = rowa + size_t(u) * kBlock;
      const uint8_t* bb = rowb + size_t(u) * kBlock;
      const uint8_t* chunk = pieces + size_t(8 * u) * kPairs * 256;
      if constexpr (kType == kQ2_K)
        kq::q2k_block<NT>(ba, bb, chunk, kPairs * 256, units + size_t(u) * NT, acc);
      else
        kq::q3k_block<NT>(ba, bb, chunk, kPairs * 256, units + size_t(u) * NT, sums + size_t(u) * NT * 4, acc);
    }
#pragma unroll
    for (int p = 0; p < kPairs; ++p)
#pragma unroll
      for (int r = 0; r < 2; ++r) red[warp][2 * p + r][lane] = acc[p][r];
    __syncthreads();
    // Value v (pair v / 2, row half v % 2) is added over the warps by warp v % warps.
    // Lane c holds terms (0, 1) for even c and (2, 3), weighing 2^-14 of them, for
    // odd c, of token 2 p + c / 2; its partner c ^ 1 the others.
    for (int v = warp; v < kValues; v += warps) {
      float s = red[0][v][lane];
      for (int w = 1; w < warps; ++w) s += red[w][v][lane];
      s *= (c & 1) ? 0x1p-14f : 1.0f;
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
      const int t = 2 * (v >> 1) + (c >> 1), o = o0 + g + 8 * (v & 1);
      if ((c & 1) == 0 && t < n_tokens && o < ne1) y[size_t(t) * size_t(ne1) + size_t(o)] = s;
    }
    __syncthreads();
  }
}

template <uint32_t kType, int NT>
cudaError_t launch(const uint8_t* w, int ne0, int ne1, size_t rb, const float* x, int n_tokens, float* y,
                   uint8_t* scratch, cudaStream_t stream) {
  const Staged s(ne0, NT);
  uint8_t* pieces = scratch;
  float* units = reinterpret_cast<float*>(scratch + s.piece_bytes);
  int* sums = kType == kQ3_K ? reinterpret_cast<int*>(scratch + s.piece_bytes + s.unit_bytes) : nullptr;
  const int sms = std::max(1, sm_count());
  const long long items = (long long)(s.chunks / 8) * NT;
  const unsigned bx = unsigned(std::min<long long>((items + 7) / 8, (long long)sms * 8));
  kq_stage_kernel<NT><<<bx, 256, 0, stream>>>(x, ne0, n_tokens, pieces, units, sums);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const long long tiles = (ne1 + kTileRows - 1) / kTileRows;
  const int warps = split_warps(ne0);
  const unsigned grid = unsigned(std::min<long long>(tiles, (long long)sms * (64 / warps)));
  kq_mmv_kernel<kType, NT><<<grid, 32 * warps, 0, stream>>>(w, ne0, ne1, rb, n_tokens, pieces, units, sums, y);
  return cudaGetLastError();
}

template <uint32_t kType>
cudaError_t launch_type(const uint8_t* w, int ne0, int ne1, size_t rb, const float* x, int n, float* y,
                        uint8_t* scratch, cudaStream_t stream) {
  switch (rounded_tokens(n)) {
    case 1: return launch<kType, 1>(w, ne0, ne1, rb, x, n, y, scratch, stream);
    case 2: return launch<kType, 2>(w, ne0, ne1, rb, x, n, y, scratch, stream);
    case 4: return launch<kType, 4>(w, ne0, ne1, rb, x, n, y, scratch, stream);
    default: return launch<kType, 8>(w, ne0, ne1, rb, x, n, y, scratch, stream);
  }
}

}  // namespace

void set_kq_mmv_split(int max_warps) {
  g_split_cap.store(std::clamp(max_warps <= 0 ? kMaxSplit : max_warps, 1, kMaxSplit), std::memory_order_relaxed);
}

size_t kq_mmv_scratch_bytes(int64_t ne0, int n_tokens) {
  return Staged(ne0, rounded_tokens(n_tokens)).bytes();
}

int kq_mmv(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x, int n_tokens, float* y,
           void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (type != kQ2_K && type != kQ3_K) return kErrType;
  if (!w || !x || !y || !scratch || ne0 <= 0 || ne1 <= 0 || ne0 % 256 != 0 || n_tokens < 1 ||
      n_tokens > kMaxMatvecTokens || ne0 > (int64_t(1) << 24) || ne1 > (int64_t(1) << 30))
    return kErrArgument;
  if (scratch_bytes < kq_mmv_scratch_bytes(ne0, n_tokens)) return kErrArgument;
  if (reinterpret_cast<uintptr_t>(w) % 16 || reinterpret_cast<uintptr_t>(x) % 4 ||
      reinterpret_cast<uintptr_t>(y) % 4 || reinterpret_cast<uintptr_t>(scratch) % 16)
    return kErrAlignment;
  const size_t rb = size_t(ne0 / 256) * (type == kQ2_K ? 84 : 110);
  const auto* wb = static_cast<const uint8_t*>(w);
  auto* sb = static_cast<uint8_t*>(scratch);
  const cudaError_t e = type == kQ2_K
                            ? launch_type<kQ2_K>(wb, int(ne0), int(ne1), rb, x, n_tokens, y, sb, stream)
                            : launch_type<kQ3_K>(wb, int(ne0), int(ne1), rb, x, n_tokens, y, sb, stream);
  return e == cudaSuccess ? kOk : kErrCuda;
}

}  // namespace xpack::kernels::dev
