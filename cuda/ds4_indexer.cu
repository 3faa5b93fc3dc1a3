// deepseek4's lightning indexer on the GPU (ds4_kernels.h's indexer_select):
// the blocks of compressed keys each query attends to. Built with
// --fmad=false (cuda/meson.build) so each score rounds as the CPU's does and
// the choice is the CPU's, ties included.
//
// Two kernels. The scores are a tiled product of a query's heads by the keys
// (every (query, block, head) dot product its own chain, many chains per
// thread), each chain still a float sum in index order and the heads summed in
// double in head order, as attention_cpu.cpp does; the choice is a radix
// select on order-preserving keys of the float scores, then one stable pass in
// block order, so it costs O(blocks) per query rather than O(blocks^2).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ds4_kernels.h"
#include "ds4_visible.cuh"

namespace xpack::rt::ds4 {
namespace {

cudaError_t launched() { return cudaGetLastError(); }

// ---- Scores ----------------------------------------------------------------

// One CTA: one query's heads (kHeads at a time) by kBlocks blocks, the head
// dimension taken kDims at a time; each thread keeps a kMicro x kMicro tile of
// (head, block) dot products in registers, so one shared-memory read of q and
// of a key feeds kMicro products each (the old kernel ran one 8192-long chain
// per thread, 1024 threads in all at n = 1).
constexpr int kHeads = 64, kBlocks = 64, kDims = 32, kMicro = 4;
constexpr int kScoreThreads = (kHeads / kMicro) * (kBlocks / kMicro);  // 256
// Tiles are stored dimension-major (a row per dimension) so a thread reads its
// kMicro heads or blocks as one float4; the +4 keeps rows 16-byte aligned
// while shifting the banks of the transposing stores.
constexpr int kPad = kHeads + 4;
static_assert(kHeads == kBlocks, "one padded row length serves both tiles");

// Rows [row0, row0 + kHeads) x dims [d0, d0 + kDims) of a row-major [rows][id]
// matrix into tile[dim][row]; what lies outside is 0, which leaves every
// running sum as it was (s + 0 == s, and a -0 sum only turns +0, which relu
// makes 0 anyway).
__device__ void load_tile(const float* m, int64_t rows, int64_t id, int64_t row0, int64_t d0,
                          float (*tile)[kPad]) {
  for (int i = threadIdx.x; i < kHeads * kDims; i += kScoreThreads) {
    const int r = i / kDims, d = i % kDims;  // a warp reads one row's kDims consecutive floats
    const int64_t gr = row0 + r, gd = d0 + d;
    tile[d][r] = (gr < rows && gd < id) ? m[gr * id + gd] : 0.0f;
  }
}

// score[t][b] = sum_h double(relu(q[t][h] . key[b]) * w[t][h]), h in order,
// each dot a float sum in index order: attention_cpu.cpp's expression. Only the
// visible blocks of queries that must choose (more visible than top_k).
__global__ void __launch_bounds__(kScoreThreads)
    indexer_score_kernel(const float* q, const float* w, const float* keys, int64_t n_blocks, int64_t n,
                         int64_t n_head, int64_t id, int64_t pos0, int64_t ratio, int64_t top_k, float* scores) {
  __shared__ __align__(16) float qs[kDims][kPad];
  __shared__ __align__(16) float ks[kDims][kPad];
  __shared__ __align__(16) float part[kHeads][kBlocks];  // relu(dot) * w of this head chunk
  const int64_t b0 = int64_t(blockIdx.x) * kBlocks;
  const int ty = threadIdx.x / (kBlocks / kMicro), tx = threadIdx.x % (kBlocks / kMicro);
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {  // uniform over the CTA: the barriers below are safe
    const int64_t n_vis = visible_blocks(pos0 + t, ratio, n_blocks);
    if (n_vis <= top_k || b0 >= n_vis) continue;
    const float* qt = q + t * n_head * id;
    const float* wt = w + t * n_head;
    double total = 0.0;  // threads < kBlocks: block b0 + threadIdx.x
    for (int64_t h0 = 0; h0 < n_head; h0 += kHeads) {
      float acc[kMicro][kMicro] = {};
      for (int64_t d0 = 0; d0 < id; d0 += kDims) {
        __syncthreads();  // the previous tiles are no longer read
        load_tile(qt, n_head, id, h0, d0, qs);
        load_tile(keys, n_vis, id, b0, d0, ks);
        __syncthreads();
#pragma unroll 8
        for (int d = 0; d < kDims; ++d) {
          const float4 a = *reinterpret_cast<const float4*>(&qs[d][ty * kMicro]);
          const float4 k = *reinterpret_cast<const float4*>(&ks[d][tx * kMicro]);
          const float av[kMicro] = {a.x, a.y, a.z, a.w}, kv[kMicro] = {k.x, k.y, k.z, k.w};
#pragma unroll
          for (int i = 0; i < kMicro; ++i)
#pragma unroll
            for (int j = 0; j < kMicro; ++j) acc[i][j] += av[i] * kv[j];  // no fma: --fmad=false
        }
      }
      __syncthreads();  // part[] of the previous chunk is summed (also when id == 0)
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        const int64_t h = h0 + ty * kMicro + i;
        const float wh = h < n_head ? wt[h] : 0.0f;
#pragma unroll
        for (int j = 0; j < kMicro; ++j) part[ty * kMicro + i][tx * kMicro + j] = fmaxf(0.0f, acc[i][j]) * wh;
      }
      __syncthreads();
      if (threadIdx.x < kBlocks) {
        const int64_t hn = min(int64_t(kHeads), n_head - h0);
        for (int64_t h = 0; h < hn; ++h) total += static_cast<double>(part[h][threadIdx.x]);
      }
    }
    if (threadIdx.x < kBlocks && b0 + threadIdx.x < n_vis) scores[t * n_blocks + b0 + threadIdx.x] = static_cast<float>(total);
  }
}

// ---- Choice ------------------------------------------------------------------

constexpr int kChooseThreads = 1024;
// Histogram copies, one per group of warps: many scores share their top bits
// (the sign and exponent), so one histogram would serialise on a few bins.
constexpr int kHistCopies = 8;

// An unsigned key whose order is the floats' order, with -0 and +0 one key
// (the CPU's == ties them). NaN (only from non-finite inputs) sorts above +inf.
__device__ inline uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ inline unsigned long long warp_inclusive_scan(unsigned long long v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long x = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += x;
  }
  return v;
}

// Exclusive prefix sum over the CTA's threads in thread order (every thread calls).
__device__ unsigned long long block_exclusive_scan(unsigned long long v) {
  __shared__ unsigned long long warp_sum[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const unsigned long long incl = warp_inclusive_scan(v);
  __syncthreads();  // warp_sum may still be read by a previous call
  if (lane == 31) warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const unsigned long long s = lane < n_warps ? warp_sum[lane] : 0ull;
    const unsigned long long si = warp_inclusive_scan(s);
    if (lane < n_warps) warp_sum[lane] = si - s;
  }
  __syncthreads();
  return warp_sum[warp] + incl - v;
}

// One CTA per query: the top_k blocks in (score descending, index ascending)
// order, written in ascending index order, as the CPU's partial_sort + sort.
// T = the top_k-th largest key (with multiplicity) is found 8 bits at a time,
// keeping `need` = how many keys equal to the prefix so far are still to take;
// then a block is chosen when its key is above T, or equal to T and among the
// first `need` such blocks by index.
__global__ void __launch_bounds__(kChooseThreads)
    indexer_choose_kernel(const float* scores, int64_t n_blocks, int64_t pos0, int64_t ratio, int64_t top_k,
                          int32_t* chosen) {
  __shared__ unsigned hist[kHistCopies][256];
  __shared__ unsigned warp_sum[8];
  __shared__ uint32_t sel_digit;
  __shared__ unsigned sel_above;
  const int64_t t = blockIdx.x;
  const int64_t n_vis = visible_blocks(pos0 + t, ratio, n_blocks);
  int32_t* out = chosen + t * top_k;
  if (n_vis <= top_k) {  // every visible block, then the padding
    for (int64_t j = threadIdx.x; j < top_k; j += blockDim.x) out[j] = j < n_vis ? int32_t(j) : -1;
    return;
  }
  const float* s = scores + t * n_blocks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0;        // the top 8 * pass bits of T
  unsigned need = unsigned(top_k);  // 1 <= need <= keys matching prefix
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int i = threadIdx.x; i < kHistCopies * 256; i += blockDim.x) (&hist[0][0])[i] = 0;
    __syncthreads();
    // Every thread runs the same trip count so whole warps meet at the match.
    for (int64_t base = 0; base < n_vis; base += blockDim.x) {
      const int64_t b = base + threadIdx.x;
      int digit = -1;
      if (b < n_vis) {
        const uint32_t key = order_key(s[b]);
        if (pass == 0 || (key >> (shift + 8)) == prefix) digit = int((key >> shift) & 255u);
      }
      // Lanes with the same digit add once, by their lowest lane.
      const unsigned same = __match_any_sync(0xffffffffu, digit);
      if (digit >= 0 && lane == __ffs(same) - 1) atomicAdd(&hist[warp % kHistCopies][digit], unsigned(__popc(same)));
    }
    __syncthreads();
    // Digits from 255 down: the one where the count of larger keys first
    // reaches need. Threads 0..255 (8 whole warps) hold one digit each.
    const int d = 255 - int(threadIdx.x);
    unsigned c = 0;
    if (threadIdx.x < 256)
      for (int r = 0; r < kHistCopies; ++r) c += hist[r][d];
    unsigned incl = unsigned(warp_inclusive_scan(c));
    if (threadIdx.x < 256 && lane == 31) warp_sum[warp] = incl;
    __syncthreads();
    if (threadIdx.x < 256) {
      for (int w8 = 0; w8 < warp; ++w8) incl += warp_sum[w8];
      const unsigned excl = incl - c;
      if (excl < need && need <= incl) {  // exactly one digit: need <= the prefix's count
        sel_digit = uint32_t(d);
        sel_above = excl;
      }
    }
    __syncthreads();
    prefix = (prefix << 8) | sel_digit;
    need -= sel_above;
  }
  const uint32_t T = prefix;
  // Each thread takes a contiguous run of blocks, so one scan of the counts
  // (above T in the high half, equal to T in the low) places every run.
  const int64_t run = (n_vis + blockDim.x - 1) / blockDim.x;
  const int64_t lo = min(n_vis, int64_t(threadIdx.x) * run), hi = min(n_vis, lo + run);
  unsigned above = 0, equal = 0;
  for (int64_t b = lo; b < hi; ++b) {
    const uint32_t key = order_key(s[b]);
    above += key > T;
    equal += key == T;
  }
  const unsigned long long before = block_exclusive_scan((static_cast<unsigned long long>(above) << 32) | equal);
  unsigned eq_seen = unsigned(before & 0xffffffffu);
  int64_t at = int64_t(before >> 32) + min(eq_seen, need);
  for (int64_t b = lo; b < hi; ++b) {
    const uint32_t key = order_key(s[b]);
    if (key > T) {
      out[at++] = int32_t(b);
    } else if (key == T) {
      if (eq_seen < need) out[at++] = int32_t(b);
      ++eq_seen;
    }
  }
}

}  // namespace

cudaError_t indexer_select(const float* q, const float* w, const float* keys, int64_t n_blocks, int64_t n,
                           int64_t n_head, int64_t head_dim, int64_t pos0, int64_t ratio, int64_t top_k,
                           float* scores, int32_t* chosen, cudaStream_t cs) {
  if (n == 0 || top_k == 0) return cudaSuccess;
  if (n_blocks > top_k) {
    const dim3 grid(unsigned((n_blocks + kBlocks - 1) / kBlocks), unsigned(std::min<int64_t>(n, 65535)));
    indexer_score_kernel<<<grid, kScoreThreads, 0, cs>>>(q, w, keys, n_blocks, n, n_head, head_dim, pos0, ratio,
                                                         top_k, scores);
    const cudaError_t e = launched();
    if (e != cudaSuccess) return e;
  }
  indexer_choose_kernel<<<unsigned(n), kChooseThreads, 0, cs>>>(scores, n_blocks, pos0, ratio, top_k, chosen);
  return launched();
}

}  // namespace xpack::rt::ds4
