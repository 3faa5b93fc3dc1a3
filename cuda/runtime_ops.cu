// The runtime's named operations on the GPU (runtime_ops.h). Built with
// --fmad=false (cuda/meson.build) so each float expression rounds as the CPU
// backend's does; row-wise operations use one block per row.
#include <algorithm>
#include <cmath>

#include "block_reduce.cuh"
#include "quant_blocks.cuh"
#include "quant_matmul.h"
#include "runtime_ops.h"

namespace xpack::rt {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16)));
}

cudaError_t launched() { return cudaGetLastError(); }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void gather_words_kernel(const uint32_t* __restrict__ src, int64_t width, const int32_t* __restrict__ ids,
                                    int64_t n, uint32_t* __restrict__ dst) {
  GRID_STRIDE(i, n * width) {
    const int64_t r = i / width, c = i - r * width;
    dst[i] = src[int64_t(ids[r]) * width + c];
  }
}

// One thread per output value: its block's bytes are read in place (the embedding
// lookup of a quantized token_embd, without bringing the ids to the host).
template <uint32_t T>
__global__ void get_rows_dequant_kernel(const uint8_t* __restrict__ table, size_t rb, int64_t width,
                                        const int32_t* __restrict__ ids, int64_t n, float* __restrict__ dst) {
  constexpr int kBe = T == 0 || T == 1 || T == 30 ? 1 : (T == 8 || T == 39 ? 32 : 256);
  constexpr int kBb = T == 0 ? 4 : T == 1 || T == 30 ? 2 : T == 8 ? 34 : T == 39 ? 17
                    : T == 10 ? 84 : T == 11 ? 110 : T == 12 ? 144 : T == 13 ? 176 : 210;
  GRID_STRIDE(e, n * width) {
    const int64_t r = e / width, i = e - r * width;
    const uint8_t* b = table + size_t(ids[r]) * rb + size_t(i / kBe) * kBb;
    dst[e] = kernels::dev::dequant_elem<T>(b, int(i % kBe));
  }
}

__global__ void set_rows_kernel(const float* __restrict__ src, int64_t width, const int32_t* __restrict__ ids,
                                int64_t n, float* __restrict__ dst) {
  GRID_STRIDE(i, n * width) {
    const int64_t r = i / width, c = i - r * width;
    dst[int64_t(ids[r]) * width + c] = src[i];
  }
}

__global__ void rms_norm_kernel(const float* x, const float* w, int64_t width, float eps, float* y) {
  const float* xr = x + blockIdx.x * width;
  const float scale = block_rms_scale(xr, width, eps);
  __syncthreads();  // y may be x: every thread has read its squares
  block_scale_row(xr, scale, w, width, y + blockIdx.x * width);
}

__global__ void l2_norm_kernel(const float* x, int64_t width, float eps, float* y) {
  const float* xr = x + blockIdx.x * width;
  const double s = block_sum_squares(xr, width);
  const float scale = 1.0f / fmaxf(sqrtf(static_cast<float>(s)), eps);
  __syncthreads();
  block_scale_row(xr, scale, nullptr, width, y + blockIdx.x * width);
}

__global__ void add_kernel(const float* a, const float* b, int64_t width, int64_t rows, int64_t b_rows, float* out) {
  GRID_STRIDE(i, width * rows) {
    const int64_t c = i % width;
    out[i] = a[i] + (b_rows == 1 ? b[c] : b[i]);
  }
}

__global__ void mul_kernel(const float* a, const float* b, int64_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}

__global__ void scale_kernel(const float* x, float s, int64_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = x[i] * s;
}

__device__ inline float unary_value(int kind, float v) {
  return kind == 0 ? 1.0f / (1.0f + expf(-v)) : sqrtf(v > 20.0f ? v : log1pf(expf(v)));
}

__global__ void unary_kernel(int kind, const float* x, int64_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = unary_value(kind, x[i]);
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float limit, float* out) {
  const bool clamp = limit > 1e-6f;
  GRID_STRIDE(i, n) {
    float g = gate[i], u = up[i];
    if (clamp) {
      g = fminf(g, limit);
      u = fminf(fmaxf(u, -limit), limit);
    }
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

// One block per row: thread 0 advances theta by repeated multiplication (as
// ggml does), then each pair's cos/sin and the rotation run in parallel.
// cache[2j], cache[2j + 1]: cos and sin (times the magnitude, sin by sin_sign)
// of pair j's angle at position `pos`, as rope_yarn_cache computes them. Every
// thread of the block calls it.
__device__ void rope_angles(float* cache, const RopeParams& p, int64_t pos, float sin_sign) {
  const int half = p.n_dims / 2;
  if (threadIdx.x == 0) {
    float theta = static_cast<float>(pos);
    for (int j = 0; j < half; ++j) {
      cache[2 * j] = theta;
      theta *= p.theta_scale;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const int i0 = 2 * j;
    const float theta_extrap = cache[i0];
    const float theta_interp = p.freq_scale * theta_extrap;
    float angle = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float y = (static_cast<float>(i0 / 2) - p.corr0) / fmaxf(0.001f, p.corr1 - p.corr0);
      const float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
      const float mix = ramp * p.ext_factor;
      angle = theta_interp * (1.0f - mix) + theta_extrap * mix;
      mscale = p.mscale_ext;
    }
    cache[i0] = cosf(angle) * mscale;
    cache[i0 + 1] = sinf(angle) * mscale * sin_sign;
  }
  __syncthreads();
}

__global__ void rope_kernel(float* x, int64_t width, int64_t head_dim, int64_t offset, RopeParams p, int64_t pos0,
                            int64_t pos_step, float sin_sign) {
  extern __shared__ float cache[];  // n_dims: cos, sin per pair
  const int half = p.n_dims / 2;
  rope_angles(cache, p, pos0 + int64_t(blockIdx.x) * pos_step, sin_sign);
  float* row = x + int64_t(blockIdx.x) * width;
  const int64_t n_heads = width / head_dim;
  for (int64_t e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
    const int64_t h = e / half;
    const int i0 = 2 * int(e - h * half);
    float* v = row + h * head_dim + offset + i0;
    const float c = cache[i0], s = cache[i0 + 1];
    const float x0 = v[0], x1 = v[1];
    v[0] = x0 * c - x1 * s;
    v[1] = x0 * s + x1 * c;
  }
}

// One block per row, a warp per head: rms_norm_kernel's expressions on each
// head (its squares summed in double by the warp), then rope_kernel's rotation
// of the n_dims dims from `offset` on, each pair read once and written once.
__global__ void rms_norm_rope_kernel(float* x, const float* w, int64_t width, int64_t head_dim, int64_t offset,
                                     float eps, RopeParams p, int64_t pos0) {
  extern __shared__ float cache[];  // n_dims: cos, sin per pair
  rope_angles(cache, p, pos0 + int64_t(blockIdx.x), 1.0f);
  float* row = x + int64_t(blockIdx.x) * width;
  const int lane = threadIdx.x & 31, warps = int(blockDim.x >> 5);
  for (int64_t h = threadIdx.x >> 5; h < width / head_dim; h += warps) {
    float* v = row + h * head_dim;
    double s = 0.0;
    for (int64_t i = lane; i < head_dim; i += 32) s += static_cast<double>(v[i] * v[i]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    const float scale = rms_scale_of(s, head_dim, eps);
    __syncwarp();  // every lane has read its squares
    for (int64_t i0 = 2 * lane; i0 < head_dim; i0 += 64) {
      float a = v[i0] * scale, b = v[i0 + 1] * scale;
      if (w) {
        a = a * w[i0];
        b = b * w[i0 + 1];
      }
      if (i0 >= offset && i0 < offset + p.n_dims) {
        const float c = cache[i0 - offset], sn = cache[i0 - offset + 1];
        const float r0 = a * c - b * sn;
        b = a * sn + b * c;
        a = r0;
      }
      v[i0] = a;
      v[i0 + 1] = b;
    }
  }
}

// In place over r[0, n), by the whole block: exp(r - max) / sum, the sum in double
// (the CPU's softmax_rows, and the attention scores').
__device__ void block_softmax(float* r, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
  m = block_max(m);
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(r[i] - m);
    r[i] = e;
    s += e;
  }
  s = block_sum(s);
  const float inv = static_cast<float>(1.0 / s);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}

__global__ void softmax_kernel(float* x, int64_t width) { block_softmax(x + int64_t(blockIdx.x) * width, width); }

// Row r of a batched attention's scores (r = group * n_head + head): the first
// visible(r) columns are the keys, an optional sink logit per head joins the
// max and the denominator (as attention_kernel's and the CPU's), and the
// columns after the keys are zeroed because the product with the values that
// follows reads whole rows.
__global__ void masked_softmax_kernel(float* s, int64_t ld, int64_t n_head, const int32_t* counts,
                                      int64_t first_count, const float* sinks) {
  const int64_t r = blockIdx.x, g = r / n_head;
  float* row = s + r * ld;
  const int64_t n = min(ld, counts ? int64_t(counts[g]) : first_count + g);
  const float sink = sinks ? sinks[r % n_head] : -INFINITY;
  float m = sink;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i]);
  m = block_max(m);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(row[i] - m);
    row[i] = e;
    sum += e;
  }
  sum = block_sum(sum);
  if (sinks) sum += static_cast<double>(expf(sink - m));
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = threadIdx.x; i < ld; i += blockDim.x) row[i] = i < n ? row[i] * inv : 0.0f;
}

// One block per row. Pick j is the best element ordered after pick j-1
// (value descending, index ascending): each thread keeps its best eligible
// element, then the block reduces. One thread per row scanned every element
// k times in sequence: 164 us for 256 router scores (H200, --profile-ops).
__device__ inline bool top_k_better(float v, int64_t i, float bv, int64_t bi) {
  return bi < 0 || (i >= 0 && (v > bv || (v == bv && i < bi)));
}

// The block's k picks of s[0, n) into ids[0, k) (written by thread 0).
__device__ void block_top_k(const float* s, int64_t n, int64_t k, int32_t* ids) {
  __shared__ float warp_v[32];
  __shared__ int64_t warp_i[32];
  __shared__ float pick_v;
  __shared__ int64_t pick_i;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  float prev_v = 0.0f;
  int64_t prev_i = -1;
  for (int64_t j = 0; j < k; ++j) {
    float bv = 0.0f;
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = s[i];
      if (prev_i >= 0 && !(v < prev_v || (v == prev_v && i > prev_i))) continue;  // not after the previous pick
      if (top_k_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, bv, o);
      const int64_t oi = __shfl_down_sync(0xffffffffu, bi, o);
      if (oi >= 0 && top_k_better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      warp_v[warp] = bv;
      warp_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = warp_v[0];
      int64_t i = warp_i[0];
      for (int w = 1; w < n_warps; ++w)
        if (warp_i[w] >= 0 && top_k_better(warp_v[w], warp_i[w], v, i)) {
          v = warp_v[w];
          i = warp_i[w];
        }
      pick_v = v;
      pick_i = i;
      ids[j] = static_cast<int32_t>(i);
    }
    __syncthreads();
    prev_v = pick_v;
    prev_i = pick_i;
    __syncthreads();  // pick_* is rewritten by the next pick
  }
}

// Rows of up to 1024 scores (every router's: 256 and 896 experts) are picked by
// one warp from registers, 32 a lane: a pick is two warp reductions and the
// winning lane's rescan of its own 32. The block's passes above cost 16 rounds of
// three barriers over shared memory: 22.5 us for Kimi-K3's 16 of 896 (H200,
// --profile-ops, 2026-12-03).
constexpr int kWarpTopKPerLane = 32;
constexpr int64_t kWarpTopKMax = 32 * kWarpTopKPerLane;

// Orders scores as unsigned ints: a > b as floats (so -0 == +0) iff key(a) > key(b).
// NaN, which no comparison ranks, is put below every number.
__device__ inline uint32_t top_k_key(float v) {
  if (v != v) return 0u;
  const uint32_t b = __float_as_uint(v + 0.0f);  // -0 + 0 is +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// block_top_k's picks (value descending, index ascending) for n <= kWarpTopKMax,
// by the calling warp alone; lane 0 writes ids.
__device__ void warp_top_k(const float* s, int n, int k, int32_t* ids) {
  const int lane = int(threadIdx.x & 31);
  uint32_t key[kWarpTopKPerLane];
  uint32_t left = 0;  // bit m: element lane + 32 m exists and is not picked yet
#pragma unroll
  for (int m = 0; m < kWarpTopKPerLane; ++m) {
    const int i = lane + 32 * m;
    key[m] = i < n ? top_k_key(s[i]) : 0u;
    if (i < n) left |= 1u << m;
  }
  // This lane's best: the highest key, the lowest index among equals.
  uint32_t best = 0;
  int best_m = -1;
  const auto rescan = [&] {
    best = 0;
    best_m = -1;
#pragma unroll
    for (int m = 0; m < kWarpTopKPerLane; ++m)
      if ((left >> m & 1u) && (best_m < 0 || key[m] > best)) {
        best = key[m];
        best_m = m;
      }
  };
  rescan();
  for (int j = 0; j < k; ++j) {
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, best_m >= 0 ? best : 0u);
    const uint32_t pick = __reduce_min_sync(0xFFFFFFFFu, best_m >= 0 && best == top ? uint32_t(lane + 32 * best_m)
                                                                                    : 0xFFFFFFFFu);
    if (lane == 0) ids[j] = int32_t(pick);
    if (lane == int(pick & 31u)) {
      left &= ~(1u << (pick >> 5));
      rescan();
    }
  }
}

// The picks of s[0, n): by one warp where they fit its registers, else by the block.
__device__ void row_top_k(const float* s, int64_t n, int64_t k, int32_t* ids) {
  if (n <= kWarpTopKMax) {
    if (threadIdx.x < 32) warp_top_k(s, int(n), int(k), ids);
  } else {
    block_top_k(s, n, k, ids);
  }
}

__global__ void top_k_kernel(const float* scores, int64_t n, int64_t k, int32_t* ids) {
  row_top_k(scores + int64_t(blockIdx.x) * n, n, k, ids + int64_t(blockIdx.x) * k);
}

// One block per row: the chain of Backend::route, each step the expression of
// its own kernel (unary, add, top_k, take, normalize, scale), in the same order.
__global__ void route_kernel(float* logits, int64_t n, int gate, const float* bias, bool select, int64_t k,
                             bool normalize, float floor, float scale, int32_t* ids, float* weights) {
  extern __shared__ float chosen_by[];  // the selection's scores, n of them
  float* row = logits + int64_t(blockIdx.x) * n;
  int32_t* row_ids = ids + int64_t(blockIdx.x) * k;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = gate >= 0 ? unary_value(gate, row[i]) : row[i];
    row[i] = v;
    if (select) chosen_by[i] = bias ? v + bias[i] : v;
  }
  __syncthreads();
  if (select) row_top_k(chosen_by, n, k, row_ids);
  __syncthreads();
  if (threadIdx.x != 0) return;
  float* w = weights + int64_t(blockIdx.x) * k;
  for (int64_t j = 0; j < k; ++j) w[j] = row[row_ids[j]];
  if (normalize) {
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += w[j];
    const float denom = fmaxf(static_cast<float>(sum), floor);
    for (int64_t j = 0; j < k; ++j) w[j] /= denom;
  }
  if (scale != 0.0f && scale != 1.0f)
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] * scale;
}

__global__ void take_kernel(const float* values, int64_t n, const int32_t* ids, int64_t k, int64_t rows, float* out) {
  GRID_STRIDE(i, rows * k) out[i] = values[(i / k) * n + ids[i]];
}

__global__ void normalize_kernel(float* x, int64_t k, int64_t rows, float floor) {
  GRID_STRIDE(r, rows) {
    float* v = x + r * k;
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += v[j];
    const float denom = fmaxf(static_cast<float>(sum), floor);
    for (int64_t j = 0; j < k; ++j) v[j] /= denom;
  }
}

// One block per (token, query head): scores (each a sequential dot product, as
// the CPU), softmax (max, exp, double sum), then each output dim summed over
// the positions in order by one thread.
__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                 const float* __restrict__ v, int64_t n_head, int64_t n_head_kv, int64_t D,
                                 int64_t pos0, float scale, float* __restrict__ out, float* scratch, int64_t n_kv) {
  extern __shared__ float smem[];
  const int64_t job = blockIdx.x, t = job / n_head, h = job % n_head, hk = h / (n_head / n_head_kv);
  const int64_t q_w = n_head * D, kv_w = n_head_kv * D, visible = pos0 + t + 1;
  float* score = scratch ? scratch + job * n_kv : smem;
  const float* qh = q + t * q_w + h * D;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    const float* kj = k + j * kv_w + hk * D;
    float s = 0.0f;
    for (int64_t d = 0; d < D; ++d) s += qh[d] * kj[d];
    score[j] = s * scale;
  }
  __syncthreads();
  block_softmax(score, visible);
  __syncthreads();
  float* oh = out + t * q_w + h * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < visible; ++j) acc += score[j] * v[j * kv_w + hk * D + d];
    oh[d] = acc;
  }
}

__global__ void combine_picks_kernel(const float* ys, int64_t d, const int32_t* rows, const float* weights, int64_t k,
                                     int64_t n_tokens, bool accumulate, float* out) {
  GRID_STRIDE(i, n_tokens * d) {
    const int64_t t = i / d, c = i - t * d;
    float acc = ys[int64_t(rows[t * k]) * d + c] * weights[t * k];
    for (int64_t j = 1; j < k; ++j) acc += ys[int64_t(rows[t * k + j]) * d + c] * weights[t * k + j];
    out[i] = accumulate ? acc + out[i] : acc;
  }
}

constexpr int64_t kSmemBytes = 96 * 1024;

// Threads of a row's block in the norms: about four values each, 32 to 1024. A
// decode row is one block, so a 16384-wide row is not 64 dependent loads per
// thread; and a head's row of 128 is one warp, not a 256-thread block with most
// threads idle and two barriers (Kimi-K3's KDA l2_norm of a 4096-token prompt's
// heads took 1.5 ms a call that way: H200, --profile-ops, 2026-12-04).
int row_threads(int64_t width) {
  return int(std::min<int64_t>(1024, std::max<int64_t>(32, (width / 4 + 31) / 32 * 32)));
}

}  // namespace

cudaError_t gather_words(const uint32_t* src, int64_t width, const int32_t* ids, int64_t n, uint32_t* dst,
                         cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  gather_words_kernel<<<grid_for(n * width), kThreads, 0, stream>>>(src, width, ids, n, dst);
  return launched();
}

cudaError_t get_rows_dequant(uint32_t type, const void* table, size_t row_bytes, int64_t width, const int32_t* ids,
                             int64_t n, float* dst, cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  const auto* t = static_cast<const uint8_t*>(table);
  const unsigned g = grid_for(n * width);
  namespace k = kernels;
  switch (type) {
    case k::kF32: get_rows_dequant_kernel<0><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kF16: get_rows_dequant_kernel<1><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kBF16: get_rows_dequant_kernel<30><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kQ8_0: get_rows_dequant_kernel<8><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kQ2_K: get_rows_dequant_kernel<10><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kQ3_K: get_rows_dequant_kernel<11><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kQ4_K: get_rows_dequant_kernel<12><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kQ5_K: get_rows_dequant_kernel<13><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kQ6_K: get_rows_dequant_kernel<14><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    case k::kMXFP4: get_rows_dequant_kernel<39><<<g, kThreads, 0, stream>>>(t, row_bytes, width, ids, n, dst); break;
    default: return cudaErrorInvalidValue;
  }
  return launched();
}

cudaError_t set_rows(const float* src, int64_t width, const int32_t* ids, int64_t n, float* dst, cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  set_rows_kernel<<<grid_for(n * width), kThreads, 0, stream>>>(src, width, ids, n, dst);
  return launched();
}

cudaError_t rms_norm(const float* x, const float* w, int64_t width, int64_t rows, float eps, float* y,
                     cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  rms_norm_kernel<<<unsigned(rows), unsigned(row_threads(width)), 0, stream>>>(x, w, width, eps, y);
  return launched();
}

cudaError_t l2_norm(const float* x, int64_t width, int64_t rows, float eps, float* y, cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  l2_norm_kernel<<<unsigned(rows), unsigned(row_threads(width)), 0, stream>>>(x, width, eps, y);
  return launched();
}

cudaError_t add(const float* a, const float* b, int64_t width, int64_t rows, int64_t b_rows, float* out,
                cudaStream_t stream) {
  if (rows * width == 0) return cudaSuccess;
  add_kernel<<<grid_for(rows * width), kThreads, 0, stream>>>(a, b, width, rows, b_rows, out);
  return launched();
}

cudaError_t mul(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  mul_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, n, out);
  return launched();
}

cudaError_t scale(const float* x, float s, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, s, n, out);
  return launched();
}

cudaError_t unary(int kind, const float* x, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unary_kernel<<<grid_for(n), kThreads, 0, stream>>>(kind, x, n, out);
  return launched();
}

cudaError_t swiglu(const float* gate, const float* up, int64_t n, float limit, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, limit, out);
  return launched();
}

cudaError_t rope(float* x, int64_t width, int64_t rows, int64_t head_dim, int64_t offset, const RopeParams& p,
                 int64_t pos0, int64_t pos_step, bool inverse, cudaStream_t stream) {
  if (rows == 0 || p.n_dims == 0) return cudaSuccess;
  rope_kernel<<<unsigned(rows), 128, size_t(p.n_dims) * sizeof(float), stream>>>(
      x, width, head_dim, offset, p, pos0, pos_step, inverse ? -1.0f : 1.0f);
  return launched();
}

cudaError_t rms_norm_rope(float* x, const float* w, int64_t width, int64_t rows, int64_t head_dim, int64_t offset,
                          float eps, const RopeParams& p, int64_t pos0, cudaStream_t stream) {
  if (head_dim <= 0 || head_dim % 2 || offset % 2 || width % head_dim || offset + p.n_dims > head_dim)
    return cudaErrorInvalidValue;
  if (rows == 0 || width == 0) return cudaSuccess;
  rms_norm_rope_kernel<<<unsigned(rows), 512, size_t(p.n_dims) * sizeof(float), stream>>>(x, w, width, head_dim,
                                                                                           offset, eps, p, pos0);
  return launched();
}

cudaError_t softmax_rows(float* x, int64_t width, int64_t rows, cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  softmax_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, width);
  return launched();
}

cudaError_t masked_softmax_rows(float* s, int64_t ld, int64_t rows, int64_t n_head, const int32_t* counts,
                                int64_t first_count, const float* sinks, cudaStream_t stream) {
  if (rows == 0 || ld == 0) return cudaSuccess;
  if (n_head <= 0 || rows > INT32_MAX) return cudaErrorInvalidValue;
  masked_softmax_kernel<<<unsigned(rows), kThreads, 0, stream>>>(s, ld, n_head, counts, first_count, sinks);
  return launched();
}

cudaError_t top_k(const float* scores, int64_t n, int64_t rows, int64_t k, int32_t* ids, cudaStream_t stream) {
  if (rows == 0 || k == 0) return cudaSuccess;
  if (k > n) return cudaErrorInvalidValue;
  top_k_kernel<<<unsigned(rows), kThreads, 0, stream>>>(scores, n, k, ids);
  return launched();
}

int64_t route_max_experts() { return 48 * 1024 / int64_t(sizeof(float)); }

cudaError_t route(float* logits, int64_t n, int64_t rows, int gate, const float* bias, bool select, int64_t k,
                  bool normalize, float floor, float scale, int32_t* ids, float* weights, cudaStream_t stream) {
  if (rows == 0 || k == 0) return cudaSuccess;
  if (n > route_max_experts() || n > INT32_MAX || (select && k > n)) return cudaErrorInvalidValue;
  route_kernel<<<unsigned(rows), kThreads, select ? size_t(n) * sizeof(float) : 0, stream>>>(
      logits, n, gate, bias, select, k, normalize, floor, scale, ids, weights);
  return launched();
}

cudaError_t take(const float* values, int64_t n, const int32_t* ids, int64_t k, int64_t rows, float* out,
                 cudaStream_t stream) {
  if (rows * k == 0) return cudaSuccess;
  take_kernel<<<grid_for(rows * k), kThreads, 0, stream>>>(values, n, ids, k, rows, out);
  return launched();
}

cudaError_t normalize_rows(float* x, int64_t k, int64_t rows, float floor, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  normalize_kernel<<<grid_for(rows), kThreads, 0, stream>>>(x, k, rows, floor);
  return launched();
}

int64_t attention_smem_positions() { return kSmemBytes / int64_t(sizeof(float)); }

cudaError_t attention(const float* q, const float* k, const float* v, int64_t n, int64_t n_head, int64_t n_head_kv,
                      int64_t head_dim, int64_t pos0, float scale, float* out, float* scratch, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t n_kv = pos0 + n;
  size_t smem = 0;
  if (!scratch) {
    if (n_kv > attention_smem_positions()) return cudaErrorInvalidValue;
    smem = size_t(n_kv) * sizeof(float);
    static bool raised = false;  // the opt-in above 48 KiB, once per process (one device)
    if (!raised && smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 int(kSmemBytes));
      if (e != cudaSuccess) return e;
      raised = true;
    }
  }
  attention_kernel<<<unsigned(n * n_head), kThreads, smem, stream>>>(q, k, v, n_head, n_head_kv, head_dim, pos0,
                                                                     scale, out, scratch, n_kv);
  return launched();
}

cudaError_t combine_picks(const float* ys, int64_t d, const int32_t* rows, const float* weights, int64_t k,
                          int64_t n_tokens, bool accumulate, float* out, cudaStream_t stream) {
  if (n_tokens * d == 0) return cudaSuccess;
  combine_picks_kernel<<<grid_for(n_tokens * d), kThreads, 0, stream>>>(ys, d, rows, weights, k, n_tokens, accumulate,
                                                                       out);
  return launched();
}

}  // namespace xpack::rt
