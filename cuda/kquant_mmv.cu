// Q2_K and Q3_K decode (1..8 tokens) on the int8 tensor cores, where set_kq_mma
// (quant_matvec.cu's kq_takes) sends it: off by default until its rule's grouped
// launches equal their problems alone (doc/kernels.md, "Q2_K and Q3_K on the int8
// tensor cores", with its measurements). A block of threads takes a tile of 16
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
// offset is two aligned shared reads and a funnel shift, and DRAM stays busy above
// the L2 (bench-kernels --kq-mma rows; --kq-split N for the split's width).
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

// One problem's staged x for NT tokens (1, 2, 4, 8) of rows of ne0 inputs: the
// pieces (256 bytes a chunk and pair of tokens), the blocks' units, and (Q3_K)
// their sums of each term, 4 ints a block and token; 16-byte aligned.
struct Staged {
  int nt, pairs, chunks;
  size_t piece_bytes, unit_bytes, sum_bytes;
  __host__ __device__ Staged(int64_t ne0, int nt_) : nt(nt_), pairs((nt_ + 1) / 2), chunks(int(ne0 / 32)) {
    piece_bytes = size_t(chunks) * size_t(pairs) * 256;
    unit_bytes = (size_t(chunks / 8) * size_t(nt) * 4 + 15) / 16 * 16;  // a power of two a 256-input block
    sum_bytes = size_t(chunks / 8) * size_t(nt) * 16;
  }
  __host__ __device__ size_t bytes() const { return piece_bytes + unit_bytes + sum_bytes; }
};

int rounded_tokens(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

// The tokens a problem of nt_real tokens stages: whole pairs (the second of a pair
// past the last token repeats it, as the other decode kernels do).
__device__ __forceinline__ int staged_tokens(int nt_real) { return nt_real + (nt_real & 1); }

// One warp a (256-input block, token) of problem blockIdx.y (products of one input:
// the one x): its 8 chunks into that problem's staged x at stage + p * stride.
template <int NT>
__global__ void __launch_bounds__(256) kq_stage_kernel(const GroupParams gp, int ne0, const float* __restrict__ x,
                                                       uint8_t* __restrict__ stage, size_t stride, bool with_sums) {
  constexpr int kPairs = (NT + 1) / 2;
  const int p = int(blockIdx.y), row0 = gp.row[p], nt_real = gp.ntok[p];
  const Staged st(ne0, NT);
  uint8_t* pieces = stage + size_t(p) * stride;
  float* units = reinterpret_cast<float*>(pieces + st.piece_bytes);
  int* sums = reinterpret_cast<int*>(pieces + st.piece_bytes + st.unit_bytes);
  const int blocks = ne0 / 256, nts = min(NT, staged_tokens(nt_real));
  for (int item = int(blockIdx.x * 8 + (threadIdx.x >> 5)); item < blocks * nts; item += int(gridDim.x) * 8) {
    const int b = item / nts, t = item - b * nts;
    kq::stage_block(x + size_t(row0 + min(t, nt_real - 1)) * size_t(ne0) + size_t(b) * 256,
                    pieces + size_t(8 * b) * kPairs * 256 + size_t(t) * 128, size_t(kPairs) * 256,
                    units + size_t(b) * NT + t, with_sums ? sums + (size_t(b) * NT + t) * 4 : nullptr);
  }
}

template <uint32_t kType, int NT>
__global__ void __launch_bounds__(32 * kMaxSplit) kq_mmv_kernel(const GroupParams gp, int ne0, int ne1,
                                                                 size_t row_bytes, float* __restrict__ y,
                                                                 const uint8_t* __restrict__ stage, size_t stride) {
  constexpr int kPairs = (NT + 1) / 2, kValues = 2 * kPairs;
  constexpr size_t kBlock = kType == kQ2_K ? 84 : 110;
  __shared__ float red[kMaxSplit][kValues][32];
  const int p = int(blockIdx.y), row0 = gp.row[p], nt_real = gp.ntok[p];
  const Staged st(ne0, NT);
  const uint8_t* pieces = stage + size_t(gp.shared ? 0 : p) * stride;
  const float* units = reinterpret_cast<const float*>(pieces + st.piece_bytes);
  const int* sums = reinterpret_cast<const int*>(pieces + st.piece_bytes + st.unit_bytes);
  const int live_pairs = (nt_real + 1) / 2;
  const int lane = int(threadIdx.x & 31), g = lane >> 2, c = lane & 3;
  const int warp = int(threadIdx.x >> 5), warps = int(blockDim.x >> 5);
  const int blocks = ne0 / 256;
  const int tiles = gp.shared ? shared_groups(gp, kTileRows) : (ne1 + kTileRows - 1) / kTileRows;
  for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
    // Products of one input: the tile's product, their tiles one after another.
    int tl = tile, rows = ne1;
    const uint8_t* W = gp.w[p];
    float* yp = y;
    if (gp.shared) {
      const int q = shared_product(gp, kTileRows, tl);
      W = gp.w[q];
      rows = gp.ne1[q];
      yp = gp.y[q];
    }
    const int o0 = tl * kTileRows;
    const uint8_t* rowa = W + size_t(min(o0 + g, rows - 1)) * row_bytes;
    const uint8_t* rowb = W + size_t(min(o0 + g + 8, rows - 1)) * row_bytes;
    float acc[kPairs][2];
#pragma unroll
    for (int q = 0; q < kPairs; ++q) acc[q][0] = acc[q][1] = 0.0f;
    for (int u = warp; u < blocks; u += warps) {
      const uint8_t* ba = rowa + size_t(u) * kBlock;
      const uint8_t* bb = rowb + size_t(u) * kBlock;
      const uint8_t* chunk = pieces + size_t(8 * u) * kPairs * 256;
      if constexpr (kType == kQ2_K)
        kq::q2k_block<NT>(ba, bb, chunk, kPairs * 256, units + size_t(u) * NT, acc, live_pairs);
      else
        kq::q3k_block<NT>(ba, bb, chunk, kPairs * 256, units + size_t(u) * NT, sums + size_t(u) * NT * 4, acc,
                          live_pairs);
    }
#pragma unroll
    for (int q = 0; q < kPairs; ++q)
#pragma unroll
      for (int r = 0; r < 2; ++r) red[warp][2 * q + r][lane] = acc[q][r];
    __syncthreads();
    // Value v (pair v / 2, row half v % 2) is added over the warps by warp v % warps.
    // Lane c holds terms (0, 1) for even c and (2, 3), weighing 2^-14 of them, for
    // odd c, of token 2 (v / 2) + c / 2; its partner c ^ 1 the others.
    for (int v = warp; v < kValues; v += warps) {
      float s = red[0][v][lane];
      for (int w = 1; w < warps; ++w) s += red[w][v][lane];
      s *= (c & 1) ? 0x1p-14f : 1.0f;
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
      const int t = 2 * (v >> 1) + (c >> 1), o = o0 + g + 8 * (v & 1);
      if ((c & 1) == 0 && t < nt_real && o < rows) yp[size_t(row0 + t) * size_t(rows) + size_t(o)] = s;
    }
    __syncthreads();
  }
}

template <uint32_t kType, int NT>
cudaError_t launch_nt(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y, uint8_t* stage,
                      cudaStream_t stream) {
  const Staged st(ne0, NT);
  const int probs = gp.shared ? 1 : gp.n;
  const int sms = std::max(1, sm_count());
  const long long items = (long long)(ne0 / 256) * NT;
  const unsigned bx = unsigned(std::min<long long>((items + 7) / 8, (long long)sms * 8));
  kq_stage_kernel<NT><<<dim3(bx, unsigned(probs)), 256, 0, stream>>>(gp, ne0, x, stage, st.bytes(), kType == kQ3_K);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const long long tiles = gp.shared ? shared_groups(gp, kTileRows) : (ne1 + kTileRows - 1) / kTileRows;
  const int warps = split_warps(ne0);
  const long long wave = std::max<long long>(1, (long long)sms * (64 / warps) / probs);
  const dim3 grid(unsigned(std::min(tiles, wave)), unsigned(probs));
  kq_mmv_kernel<kType, NT><<<grid, 32 * warps, 0, stream>>>(gp, ne0, ne1, rb, y, stage, st.bytes());
  return cudaGetLastError();
}

template <uint32_t kType>
cudaError_t launch_type(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y, int nt_max,
                        uint8_t* stage, cudaStream_t stream) {
  switch (rounded_tokens(nt_max)) {
    case 1: return launch_nt<kType, 1>(gp, ne0, ne1, rb, x, y, stage, stream);
    case 2: return launch_nt<kType, 2>(gp, ne0, ne1, rb, x, y, stage, stream);
    case 4: return launch_nt<kType, 4>(gp, ne0, ne1, rb, x, y, stage, stream);
    default: return launch_nt<kType, 8>(gp, ne0, ne1, rb, x, y, stage, stream);
  }
}

}  // namespace

size_t kq_stage_bytes(int64_t ne0, int nt_max) { return Staged(ne0, rounded_tokens(nt_max)).bytes(); }

cudaError_t launch_kq_mmv(uint32_t type, const GroupParams& gp, int ne0, int ne1, size_t row_bytes, const float* x,
                          float* y, int nt_max, uint8_t* stage, size_t stage_bytes, cudaStream_t stream) {
  const int probs = gp.shared ? 1 : gp.n;
  const size_t each = kq_stage_bytes(ne0, nt_max);
  if (!stage || reinterpret_cast<uintptr_t>(stage) % 16 || each > stage_bytes) return cudaErrorNotSupported;
  // As many problems a launch as the stage holds; each problem's sums are its own.
  const int per = int(std::min<size_t>(size_t(probs), stage_bytes / each));
  if (per < probs) {
    for (int i = 0; i < gp.n; i += per) {
      GroupParams part = gp;
      part.n = std::min(per, gp.n - i);
      for (int j = 0; j < part.n; ++j) {
        part.w[j] = gp.w[i + j];
        part.row[j] = gp.row[i + j];
        part.ntok[j] = gp.ntok[i + j];
      }
      int nt = 1;
      for (int j = 0; j < part.n; ++j) nt = std::max(nt, int(part.ntok[j]));
      if (const cudaError_t e = launch_kq_mmv(type, part, ne0, ne1, row_bytes, x, y, nt, stage, stage_bytes, stream);
          e != cudaSuccess)
        return e;
    }
    return cudaSuccess;
  }
  return type == kQ2_K ? launch_type<kQ2_K>(gp, ne0, ne1, row_bytes, x, y, nt_max, stage, stream)
                       : launch_type<kQ3_K>(gp, ne0, ne1, row_bytes, x, y, nt_max, stage, stream);
}

void set_kq_mmv_split(int max_warps) {
  g_split_cap.store(std::clamp(max_warps <= 0 ? kMaxSplit : max_warps, 1, kMaxSplit), std::memory_order_relaxed);
}

size_t kq_mmv_scratch_bytes(int64_t ne0, int n_tokens) { return kq_stage_bytes(ne0, n_tokens); }

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
  GroupParams gp{};
  gp.n = 1;
  gp.w[0] = static_cast<const uint8_t*>(w);
  gp.ntok[0] = n_tokens;
  const size_t rb = size_t(ne0 / 256) * (type == kQ2_K ? 84 : 110);
  const cudaError_t e = launch_kq_mmv(type, gp, int(ne0), int(ne1), rb, x, y, n_tokens, static_cast<uint8_t*>(scratch),
                                      scratch_bytes, stream);
  return e == cudaSuccess ? kOk : kErrCuda;
}

}  // namespace xpack::kernels::dev
