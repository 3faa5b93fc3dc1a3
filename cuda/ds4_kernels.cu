// deepseek4's operations on the GPU (ds4_kernels.h). Built with --fmad=false
// (cuda/meson.build) so each float expression rounds as the CPU's does.
#include <algorithm>
#include <cmath>

#include "block_reduce.cuh"
#include "ds4_kernels.h"
#include "ds4_visible.cuh"

namespace xpack::rt::ds4 {
namespace {

constexpr int kThreads = 256;
// The attention core's block: more warps than the other kernels, since one
// (token, head) block walks every key of a decode step twice (scores, values).
constexpr int kAttnThreads = 512;
constexpr int kAttnWarps = kAttnThreads / 32;
// Output dims a warp accumulates per pass over its keys: 8 per lane.
constexpr int kAttnDims = 256;
constexpr int64_t kRedBytes = int64_t(kAttnWarps) * kAttnDims * sizeof(float);
// Dynamic shared memory without the opt-in, less the attention's static reduction buffer.
constexpr int64_t kSmemBytes = 48 * 1024 - kRedBytes - 1024;
// Attention of fewer (token, head) jobs than this splits each query's keys: an
// H200 (132 SMs) holds four 512-thread blocks per SM at once.
constexpr int64_t kSplitBelowJobs = 4 * 132;
constexpr int64_t kMaxSplits = 16;

unsigned grid_for(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16)));
}

cudaError_t launched() { return cudaGetLastError(); }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- hyper-connections ------------------------------------------------------

// c[src * hc + dst] (in shared memory): a softmax over dst for every src, +
// eps, then Sinkhorn: columns, then (rows, columns) iters - 1 more times, each
// line divided by (its sum in double, rounded, + eps). Thread e < hc * hc owns
// entry e and sums its line itself in the line's order, so every entry rounds
// as the CPU's sequential loop does; one thread doing all 16 entries of 20
// passes was 67 us of latency per call (H200, --profile-ops). For more copies
// than warp_sinkhorn (below) holds. Every thread of the block calls it.
__device__ void sinkhorn(float* c, int hc, int iters, float eps) {
  const int e = threadIdx.x, r = e / max(hc, 1), i = e - r * hc;
  const bool own = e < hc * hc;
  float v = 0.0f;
  if (own) {
    const float* row = c + r * hc;
    float mx = -INFINITY;
    for (int j = 0; j < hc; ++j) mx = fmaxf(mx, row[j]);
    double sum = 0.0;
    for (int j = 0; j < hc; ++j) sum += expf(row[j] - mx);
    const float inv = static_cast<float>(1.0 / sum);
    v = expf(row[i] - mx) * inv;
  }
  __syncthreads();
  if (own) c[e] = v + eps;
  __syncthreads();
  auto normalize = [&](bool columns) {
    float out = 0.0f;
    if (own) {
      double sum = 0.0;
      for (int j = 0; j < hc; ++j) sum += columns ? c[j * hc + i] : c[r * hc + j];
      const float denom = static_cast<float>(sum) + eps;
      out = c[e] / denom;
    }
    __syncthreads();
    if (own) c[e] = out;
    __syncthreads();
  };
  normalize(true);
  for (int it = 1; it < iters; ++it) {
    normalize(false);
    normalize(true);
  }
}

// sinkhorn() by one warp from registers, for hc * hc <= 32: lane e < hc * hc
// holds entry e and gathers its line by shuffles, then adds it in the line's
// order: the same expressions in the same order, so the same bits. The 41
// passes are a dependent chain, so each pass's latency is the whole cost: the
// block version's shared-memory round and two barriers a pass made it the tail
// of hc_pre (18.4 us a call, 12 calls a DeepSeek-V4 decode step; H200,
// --profile-ops, 2026-12-04). Lanes past the matrix shadow entry 0 and their
// results are dropped. Every lane of the warp calls it; x is the lane's entry.
template <int HC>
__device__ float warp_sinkhorn(float x, int iters, float eps) {
  constexpr int kN = HC * HC;
  static_assert(kN <= 32, "one entry per lane");
  const int lane = threadIdx.x & 31, e = lane < kN ? lane : 0, r = e / HC, i = e - r * HC;
  float line[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) line[j] = __shfl_sync(0xffffffffu, x, r * HC + j);
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < HC; ++j) mx = fmaxf(mx, line[j]);
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < HC; ++j) sum += expf(line[j] - mx);
  const float inv = static_cast<float>(1.0 / sum);
  float v = expf(x - mx) * inv;
  v = v + eps;
  auto normalize = [&](bool columns) {
#pragma unroll
    for (int j = 0; j < HC; ++j) line[j] = __shfl_sync(0xffffffffu, v, columns ? j * HC + i : r * HC + j);
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < HC; ++j) s += line[j];
    const float denom = static_cast<float>(s) + eps;
    v = v / denom;
  };
  normalize(true);
  for (int it = 1; it < iters; ++it) {
    normalize(false);
    normalize(true);
  }
  return v;
}

// warp_sinkhorn for a run-time hc <= kMaxWarpHc (warp-uniform).
constexpr int kMaxWarpHc = 5;
__device__ float warp_sinkhorn_of(int hc, float x, int iters, float eps) {
  switch (hc) {
    case 1: return warp_sinkhorn<1>(x, iters, eps);
    case 2: return warp_sinkhorn<2>(x, iters, eps);
    case 3: return warp_sinkhorn<3>(x, iters, eps);
    case 4: return warp_sinkhorn<4>(x, iters, eps);
    default: return warp_sinkhorn<5>(x, iters, eps);
  }
}

// out[i] = copy0[i] * w[0] + copy1[i] * w[1] + ..., in that order (the CPU's),
// for the block's chunk of kThreads values; returns the thread's value (0
// past the end).
__device__ float weighted_copies(const float* row, const float* w, int hc, int64_t d, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return 0.0f;
  float acc = row[i] * w[0];
  for (int h = 1; h < hc; ++h) acc += row[h * d + i] * w[h];
  out[i] = acc;
  return acc;
}

// The sub-layer's rms_norm of a token's input, whose chunks the token's first
// `blocks` blocks wrote: each block leaves its chunk's sum of squares in
// partials and counts itself done; the last one to count adds the sums in
// block order (which block is last decides only who adds) and scales the whole
// row, in rms_norm_kernel's expressions. Every thread of the block calls it.
__device__ void norm_when_last(float v, const float* norm_w, float eps, int64_t d, unsigned blocks, double* partials,
                               unsigned* counter, float* row) {
  __shared__ bool last;
  __threadfence();  // this thread's chunk of the row reaches L2 before the count
  const double sq = block_sum(static_cast<double>(v * v));
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sq;
    __threadfence();
    last = atomicAdd(counter, 1u) == blocks - 1;
    if (last) __threadfence();  // the reads below come after the completed count
  }
  __syncthreads();
  if (!last) return;
  double s = 0.0;
  for (unsigned b = 0; b < blocks; ++b) s += __ldcg(partials + b);
  const float r = rms_scale_of(s, d, eps);
  block_scale_row(row, r, norm_w, d, row);  // its loads bypass L1, which holds nothing of the other blocks' writes
  if (threadIdx.x == 0) *counter = 0u;  // the next launch finds it zero
}

// Blocks (chunk of n_embd, token): every block but the last forms pre (hc
// sigmoids) and mixes its chunk; the last forms post and comb (Sinkhorn) alone,
// beside them: when block 0 also did the Sinkhorn's 20 passes, they came before
// its chunk, and its chunk (often the last one done) before the row's norm. The
// mixes are fn . stream, scaled here by the stream's norm (ds4_ops.h).
__global__ void hc_pre_kernel(const float* mixes, const float* base, const float* scale, const float* stream, int64_t n,
                              int hc, int64_t d, int iters, float eps, float rms_eps, float* input, float* post,
                              float* comb, const float* norm_w, double* partials, unsigned* counters) {
  __shared__ float pre[kMaxHc];
  __shared__ float c[kMaxHc * kMaxHc];
  const int md = (2 + hc) * hc;
  const int h = threadIdx.x;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {  // grid.y is at most 65535
    const float* m = mixes + t * md;
    // The scale rms_norm of the token's whole stream applies: each block reads
    // the stream for it (64 KiB for DeepSeek-V4, from L2) rather than a launch
    // of its own writing the normed copies out.
    const float r = block_rms_scale(stream + t * hc * d, hc * d, rms_eps);
    const unsigned copiers = gridDim.x - 1;
    if (blockIdx.x == copiers) {  // block-uniform: sinkhorn synchronises the block
      if (h < hc) post[t * hc + h] = 2.0f * sigmoidf(m[hc + h] * r * scale[1] + base[hc + h]);
      if (hc <= kMaxWarpHc) {  // warp 0 alone; no shared memory, so no barrier before the next token
        if (h < 32) {
          const float x = h < hc * hc ? m[2 * hc + h] * r * scale[2] + base[2 * hc + h] : 0.0f;
          const float v = warp_sinkhorn_of(hc, x, iters, eps);
          if (h < hc * hc) comb[t * hc * hc + h] = v;
        }
        continue;
      }
      if (h < hc * hc) c[h] = m[2 * hc + h] * r * scale[2] + base[2 * hc + h];
      __syncthreads();
      sinkhorn(c, hc, iters, eps);
      if (h < hc * hc) comb[t * hc * hc + h] = c[h];
      __syncthreads();  // c is rewritten for the next token
      continue;
    }
    if (h < hc) pre[h] = sigmoidf(m[h] * r * scale[0] + base[h]) + eps;
    __syncthreads();
    const float v = weighted_copies(stream + t * hc * d, pre, hc, d, input + t * d);
    if (norm_w) norm_when_last(v, norm_w, rms_eps, d, copiers, partials + t * copiers, counters + t, input + t * d);
    __syncthreads();  // pre is rewritten for the next token
  }
}

// One thread per (token, value): all hc copies of it are read before any is
// written, so the stream may be the residual (in place).
__global__ void hc_post_kernel(const float* output, const float* residual, const float* post, const float* comb,
                               int64_t n, int hc, int64_t d, float* stream) {
  GRID_STRIDE(e, n * d) {
    const int64_t i = e % d, t = e / d;
    const float* res = residual + t * hc * d;
    const float* c = comb + t * hc * hc;
    float copy[kMaxHc];
    for (int src = 0; src < hc; ++src) copy[src] = res[src * d + i];
    const float f = output[t * d + i];
    for (int dst = 0; dst < hc; ++dst) {
      float acc = f * post[t * hc + dst];
      for (int src = 0; src < hc; ++src) acc += copy[src] * c[src * hc + dst];
      stream[t * hc * d + dst * d + i] = acc;
    }
  }
}

__global__ void hc_head_kernel(const float* mixes, const float* base, const float* scale, const float* stream, int64_t n,
                               int hc, int64_t d, float eps, float rms_eps, float* out, const float* norm_w,
                               double* partials, unsigned* counters) {
  __shared__ float pre[kMaxHc];
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const float r = block_rms_scale(stream + t * hc * d, hc * d, rms_eps);
    if (threadIdx.x < hc)
      pre[threadIdx.x] = sigmoidf(mixes[t * hc + threadIdx.x] * r * scale[0] + base[threadIdx.x]) + eps;
    __syncthreads();
    const float v = weighted_copies(stream + t * hc * d, pre, hc, d, out + t * d);
    if (norm_w) norm_when_last(v, norm_w, rms_eps, d, gridDim.x, partials + t * gridDim.x, counters + t, out + t * d);
    __syncthreads();
  }
}

// ---- compressor -------------------------------------------------------------

// One thread per (block, channel): entry j's value and score (the previous
// block's first halves, then the own block's second halves when overlapping),
// softmax over the scores (max, exp, double sum, float 1/sum), then the
// weighted values summed in double in entry order. exp is recomputed in each
// pass instead of stored: the same bits.
__global__ void compress_pool_kernel(const float* kv, const float* score, int64_t rows_first, int64_t first_block,
                                     int64_t n_out, int64_t width, int64_t ratio, bool overlap, float* out) {
  const int64_t row_width = overlap ? 2 * width : width, n_entries = overlap ? 2 * ratio : ratio;
  GRID_STRIDE(e, n_out * width) {
    const int64_t ob = e / width, c = e - ob * width, b = first_block + ob;
    auto entry = [&](int64_t j, float& value, float& s) {
      int64_t pos, col;
      if (overlap && j < ratio) {
        pos = (b - 1) * ratio + j;
        col = c;
      } else {
        pos = b * ratio + (overlap ? j - ratio : j);
        col = overlap ? width + c : c;
      }
      if (pos < 0) {
        value = 0.0f;
        s = -INFINITY;
      } else {
        const int64_t r = (pos - rows_first) * row_width + col;
        value = kv[r];
        s = score[r];
      }
    };
    float v, s, mx = -INFINITY;
    for (int64_t j = 0; j < n_entries; ++j) {
      entry(j, v, s);
      mx = fmaxf(mx, s);
    }
    double denom = 0.0;
    for (int64_t j = 0; j < n_entries; ++j) {
      entry(j, v, s);
      denom += expf(s - mx);
    }
    const float inv = static_cast<float>(1.0 / denom);
    double sum = 0.0;
    for (int64_t j = 0; j < n_entries; ++j) {
      entry(j, v, s);
      const float p = expf(s - mx) * inv;
      sum += static_cast<double>(v * p);
    }
    out[e] = static_cast<float>(sum);
  }
}

// ---- attention --------------------------------------------------------------

// Query t's chosen blocks, -1 dropped and the order kept, listed by warp 0 into
// `listed` with one ballot per 32 entries (thread 0 alone, one entry after
// another, took most of a decode step's attention on the indexer's layers);
// every thread of the block gets the count.
__device__ int list_chosen(const AttentionArgs& a, int64_t t, int* listed) {
  __shared__ int n_listed;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    int m = 0;
    for (int64_t j0 = 0; j0 < a.n_chosen; j0 += 32) {
      const int64_t j = j0 + lane;
      const int32_t b = j < a.n_chosen ? a.chosen[t * a.n_chosen + j] : -1;
      const unsigned keep = __ballot_sync(0xFFFFFFFFu, b >= 0);
      if (b >= 0) listed[m + __popc(keep & ((1u << lane) - 1u))] = b;
      m += __popc(keep);
    }
    if (lane == 0) n_listed = m;
  }
  __syncthreads();
  return n_listed;
}

// Block (job, split) with job = token * n_head + head. Keys: the raw window,
// then the chosen (or all visible) blocks; each score is one warp's dot (lanes
// over the head dims, so a key's row is read in coalesced runs; a thread-per-key
// dot read 512 scattered floats per thread and was most of a long prompt's
// attention). The weighted sum of the values is spread the same way: warp w
// sums keys w, w + warps, ... (lanes over the dims), then the warps' partial
// sums are added in warp order. One thread per output dim summing every key in
// turn was 180-330 us per decode step's layer (H200, --profile-ops).
//
// With one split the block owns all of its query's keys: the softmax takes the
// sink logit into its max and denominator and the output is final. With more
// (a decode step has one block per head, too few for 132 SMs), split s takes
// an equal share of the keys and leaves its max, its sum of exponentials and
// its unnormalised values in `part` for attention_combine_kernel.
__global__ void __launch_bounds__(kAttnThreads)
    attention_kernel(AttentionArgs a, float* scratch, int64_t max_keys, float* part) {
  extern __shared__ float smem[];
  __shared__ float red[kAttnWarps][kAttnDims];
  const int64_t job = blockIdx.x, t = job / a.n_head, h = job % a.n_head, hd = a.head_dim;
  const int n_split = int(gridDim.y), split = int(blockIdx.y);
  const int64_t pos = a.pos0 + t;
  const int64_t raw_lo = max(a.raw_first, pos - a.window + 1), n_raw = pos - raw_lo + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int* listed = reinterpret_cast<int*>(smem);  // the chosen blocks, -1 dropped, in order
  float* score = scratch ? scratch + job * max_keys : smem + a.n_chosen;
  const int64_t n_listed = a.chosen ? list_chosen(a, t, listed) : 0;
  const int64_t n_block_keys = a.chosen ? n_listed : (a.blocks ? visible_blocks(pos, a.ratio, a.n_blocks) : 0);
  const int64_t n_keys = n_raw + n_block_keys, per = (n_keys + n_split - 1) / n_split;
  const int64_t j_lo = min(n_keys, split * per), j_hi = min(n_keys, j_lo + per);
  auto key = [&](int64_t j) -> const float* {
    if (j < n_raw) return a.raw + (raw_lo - a.raw_first + j) * hd;
    const int64_t b = a.chosen ? listed[j - n_raw] : j - n_raw;
    return a.blocks + b * hd;
  };
  const float* qh = a.q + t * a.n_head * hd + h * hd;
  for (int64_t j = j_lo + warp; j < j_hi; j += kAttnWarps) {
    const float* kj = key(j);
    float d = 0.0f;
    for (int64_t i = lane; i < hd; i += 32) d = __fmaf_rn(qh[i], kj[i], d);
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xFFFFFFFFu, d, o);
    if (lane == 0) score[j] = d * a.scale;
  }
  __syncthreads();
  const bool whole = n_split == 1;
  const float sink = a.sinks[h];
  float m = whole ? sink : -INFINITY;
  for (int64_t j = j_lo + threadIdx.x; j < j_hi; j += blockDim.x) m = fmaxf(m, score[j]);
  m = block_max(m);
  double s = 0.0;
  for (int64_t j = j_lo + threadIdx.x; j < j_hi; j += blockDim.x) {
    const float e = expf(score[j] - m);
    score[j] = e;
    s += e;
  }
  s = block_sum(s);
  if (whole) s += static_cast<double>(expf(sink - m));
  const float inv = whole ? static_cast<float>(1.0 / s) : 1.0f;
  __syncthreads();
  float* oh = whole ? a.out + job * hd : part + (job * n_split + split) * (hd + 2) + 2;
  if (!whole && threadIdx.x == 0) {
    oh[-2] = m;
    oh[-1] = static_cast<float>(s);
  }
  constexpr int kPerLane = kAttnDims / 32;
  for (int64_t d0 = 0; d0 < hd; d0 += kAttnDims) {
    float acc[kPerLane];
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) acc[q] = 0.0f;
    for (int64_t j = j_lo + warp; j < j_hi; j += kAttnWarps) {
      const float p = score[j] * inv;
      const float* kj = key(j) + d0;
#pragma unroll
      for (int q = 0; q < kPerLane; ++q) {
        const int64_t i = lane + 32 * q;
        if (d0 + i < hd) acc[q] += p * kj[i];
      }
    }
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) red[warp][lane + 32 * q] = acc[q];
    __syncthreads();
    for (int i = threadIdx.x; i < kAttnDims && d0 + i < hd; i += blockDim.x) {
      float o = red[0][i];
      for (int w = 1; w < kAttnWarps; ++w) o += red[w][i];
      oh[d0 + i] = o;
    }
    __syncthreads();  // red is rewritten by the next pass
  }
}

// One block per (token, head): the splits' partial softmaxes joined with the
// sink logit, as one softmax over all the keys would be (in split order).
__global__ void attention_combine_kernel(const float* part, int n_split, int64_t hd, int64_t n_head,
                                         const float* sinks, float* out) {
  const int64_t job = blockIdx.x, stride = hd + 2;
  const float* p = part + job * n_split * stride;
  const float sink = sinks[job % n_head];
  float m = sink;
  for (int s = 0; s < n_split; ++s) m = fmaxf(m, p[s * stride]);
  double sum = static_cast<double>(expf(sink - m));
  for (int s = 0; s < n_split; ++s) sum += static_cast<double>(p[s * stride + 1]) * expf(p[s * stride] - m);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < n_split; ++s) o += p[s * stride + 2 + d] * expf(p[s * stride] - m);
    out[job * hd + d] = o * inv;
  }
}

// ---- a prompt's attention as products: each query's keys in one matrix ----

// Keys one block of the gather copies; the grid's second dimension covers a
// query's max_keys with these.
constexpr int64_t kGatherKeys = 32;

// Block (tl, y) copies keys [y * kGatherKeys, ...) of query t0 + tl, in
// attention_kernel's order, zeros after its last one.
__global__ void attention_gather_kernel(AttentionArgs a, int64_t t0, int64_t max_keys, float* keys, int32_t* counts) {
  extern __shared__ int listed[];
  const int64_t tl = blockIdx.x, t = t0 + tl, pos = a.pos0 + t, hd = a.head_dim;
  const int64_t raw_lo = max(a.raw_first, pos - a.window + 1), n_raw = pos - raw_lo + 1;
  const int64_t n_listed = a.chosen ? list_chosen(a, t, listed) : 0;
  const int64_t n_block_keys = a.chosen ? n_listed : (a.blocks ? visible_blocks(pos, a.ratio, a.n_blocks) : 0);
  const int64_t n_keys = n_raw + n_block_keys;
  if (blockIdx.y == 0 && threadIdx.x == 0) counts[tl] = int32_t(n_keys);
  const int64_t j0 = int64_t(blockIdx.y) * kGatherKeys, j1 = min(j0 + kGatherKeys, max_keys);
  float* dst = keys + (tl * max_keys + j0) * hd;
  for (int64_t e = threadIdx.x; e < (j1 - j0) * hd; e += blockDim.x) {
    const int64_t j = j0 + e / hd, i = e % hd;
    float v = 0.0f;
    if (j < n_raw) {
      v = a.raw[(raw_lo - a.raw_first + j) * hd + i];
    } else if (j < n_keys) {
      const int64_t b = a.chosen ? listed[j - n_raw] : j - n_raw;
      v = a.blocks[b * hd + i];
    }
    dst[e] = v;
  }
}

size_t attention_smem(const AttentionArgs& a, int64_t max_keys) {
  return size_t(a.n_chosen) * sizeof(int) + size_t(max_keys) * sizeof(float);
}

}  // namespace

int64_t hc_norm_blocks(int64_t d) { return (d + kThreads - 1) / kThreads; }

cudaError_t hc_pre(const float* mixes, const float* base, const float* scale, const float* stream, int64_t n, int hc,
                   int64_t d, int sinkhorn_iters, float eps, float rms_eps, float* input, float* post, float* comb,
                   const HcNorm* norm, cudaStream_t cs) {
  if (hc < 1 || hc > kMaxHc) return cudaErrorInvalidValue;
  if (norm && (!norm->weight || !norm->partials || !norm->counters)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  static_assert(kThreads >= kMaxHc * kMaxHc, "a Sinkhorn entry per thread");
  // hc_norm_blocks(d) blocks mix the copies, one more forms post and comb.
  const dim3 grid(unsigned(hc_norm_blocks(d) + 1), unsigned(std::min<int64_t>(n, 65535)));
  hc_pre_kernel<<<grid, kThreads, 0, cs>>>(mixes, base, scale, stream, n, hc, d, sinkhorn_iters, eps, rms_eps, input,
                                           post, comb, norm ? norm->weight : nullptr,
                                           norm ? norm->partials : nullptr, norm ? norm->counters : nullptr);
  return launched();
}

cudaError_t hc_post(const float* output, const float* residual, const float* post, const float* comb, int64_t n,
                    int hc, int64_t d, float* stream, cudaStream_t cs) {
  if (hc < 1 || hc > kMaxHc) return cudaErrorInvalidValue;
  if (n * hc * d == 0) return cudaSuccess;
  hc_post_kernel<<<grid_for(n * d), kThreads, 0, cs>>>(output, residual, post, comb, n, hc, d, stream);
  return launched();
}

cudaError_t hc_head(const float* mixes, const float* base, const float* scale, const float* stream, int64_t n, int hc,
                    int64_t d, float eps, float rms_eps, float* out, const HcNorm* norm, cudaStream_t cs) {
  if (hc < 1 || hc > kMaxHc) return cudaErrorInvalidValue;
  if (norm && (!norm->weight || !norm->partials || !norm->counters)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const dim3 grid(unsigned(hc_norm_blocks(d)), unsigned(std::min<int64_t>(n, 65535)));
  hc_head_kernel<<<grid, kThreads, 0, cs>>>(mixes, base, scale, stream, n, hc, d, eps, rms_eps, out,
                                            norm ? norm->weight : nullptr, norm ? norm->partials : nullptr,
                                            norm ? norm->counters : nullptr);
  return launched();
}

cudaError_t compress_pool(const float* kv, const float* score, int64_t rows_first, int64_t first_block,
                          int64_t n_out, int64_t width, int64_t ratio, bool overlap, float* out, cudaStream_t cs) {
  if (n_out * width == 0) return cudaSuccess;
  compress_pool_kernel<<<grid_for(n_out * width), kThreads, 0, cs>>>(kv, score, rows_first, first_block, n_out, width,
                                                                     ratio, overlap, out);
  return launched();
}

int64_t attention_max_keys(const AttentionArgs& a) {
  const int64_t n_raw = std::min(a.window, a.raw_rows);
  return std::max<int64_t>(1, n_raw + (a.chosen ? a.n_chosen : (a.blocks ? a.n_blocks : 0)));
}

bool attention_fits_smem(const AttentionArgs& a) {
  return int64_t(attention_smem(a, attention_max_keys(a))) <= kSmemBytes;
}

bool attention_gather_fits(const AttentionArgs& a) {
  return int64_t(a.n_chosen) * int64_t(sizeof(int)) <= kSmemBytes && attention_max_keys(a) / kGatherKeys < 65535;
}

cudaError_t attention_gather(const AttentionArgs& a, int64_t t0, int64_t m, float* keys, int32_t* counts,
                             cudaStream_t cs) {
  if (m == 0) return cudaSuccess;
  if (!attention_gather_fits(a) || t0 < 0 || m < 0 || t0 + m > a.n || m > 65535) return cudaErrorInvalidValue;
  const int64_t max_keys = attention_max_keys(a);
  const dim3 grid(unsigned(m), unsigned((max_keys + kGatherKeys - 1) / kGatherKeys));
  attention_gather_kernel<<<grid, kThreads, size_t(a.chosen ? a.n_chosen : 0) * sizeof(int), cs>>>(a, t0, max_keys,
                                                                                                   keys, counts);
  return launched();
}

int attention_splits(const AttentionArgs& a) {
  // Up to one wave of blocks, each with a share of at least 32 keys (two per warp).
  if (a.n * a.n_head >= kSplitBelowJobs) return 1;
  return int(std::clamp<int64_t>(attention_max_keys(a) / 32, 1,
                                 std::min<int64_t>(kMaxSplits, kSplitBelowJobs / std::max<int64_t>(1, a.n * a.n_head))));
}

cudaError_t attention(const AttentionArgs& a, float* scratch, float* part, cudaStream_t cs) {
  if (a.n == 0) return cudaSuccess;
  const int64_t max_keys = attention_max_keys(a);
  if (!scratch && !attention_fits_smem(a)) return cudaErrorInvalidValue;
  const int n_split = attention_splits(a);
  if (n_split > 1 && !part) return cudaErrorInvalidValue;
  const size_t smem = scratch ? size_t(a.n_chosen) * sizeof(int) : attention_smem(a, max_keys);
  attention_kernel<<<dim3(unsigned(a.n * a.n_head), unsigned(n_split)), kAttnThreads, smem, cs>>>(a, scratch, max_keys,
                                                                                                  part);
  if (n_split > 1) {
    const cudaError_t e = launched();
    if (e != cudaSuccess) return e;
    attention_combine_kernel<<<unsigned(a.n * a.n_head), kThreads, 0, cs>>>(part, n_split, a.head_dim, a.n_head,
                                                                            a.sinks, a.out);
  }
  return launched();
}

}  // namespace xpack::rt::ds4
