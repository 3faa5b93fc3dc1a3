// kimi-k3's own operations on the GPU (kimi_kernels.h). Compiled with
// --fmad=false: every float expression rounds as in models/kimi_k3/*_cpu.cpp.
#include <algorithm>
#include <cmath>

#include "block_reduce.cuh"
#include "kimi_kernels.h"

namespace xpack::rt::kimi {
namespace {

constexpr int kThreads = 256;

cudaError_t launched() { return cudaGetLastError(); }

unsigned grid_for(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16)));
}

// The opt-in shared memory one block may have on the current device.
int64_t smem_optin() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 48 * 1024;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 48 * 1024;
  return bytes;
}

// Room kept for the static shared arrays of block_reduce.cuh (32 doubles, 32 floats).
constexpr int64_t kStaticSmem = 512;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

struct Ckpts {
  const float* p[kMaxCkpts];
};

// One block per token: each candidate's score, the softmax over them, the mix.
// A decode step is one block, so it is a wide one: with 256 threads its passes
// over the candidates' rows took 19 us a call (Kimi-K3, H200 --profile-ops,
// 2026-12-03). Fixed, not chosen by the token count: a prompt's rows round as
// the decode steps' do.
constexpr int kResMixThreads = 1024;
__global__ void __launch_bounds__(kResMixThreads)
    res_mix_kernel(const float* __restrict__ cur, Ckpts ckpts, int nc, const float* __restrict__ w, int64_t width,
                   float eps, float* __restrict__ out) {
  __shared__ float p[kMaxCkpts + 1];
  const int64_t t = blockIdx.x;
  for (int c = 0; c <= nc; ++c) {
    const float* row = (c < nc ? ckpts.p[c] : cur) + t * width;
    const float s = block_rms_scale(row, width, eps);
    double dot = 0.0;
    for (int64_t i = threadIdx.x; i < width; i += kResMixThreads) dot += double((row[i] * s) * w[i]);
    dot = block_sum(dot);
    if (threadIdx.x == 0) p[c] = float(dot);
  }
  if (threadIdx.x == 0) {  // softmax_row over nc + 1 values, in its order
    float mx = -INFINITY;
    for (int c = 0; c <= nc; ++c) mx = fmaxf(mx, p[c]);
    double sum = 0.0;
    for (int c = 0; c <= nc; ++c) {
      p[c] = expf(p[c] - mx);
      sum += p[c];
    }
    const float inv = float(1.0 / sum);
    for (int c = 0; c <= nc; ++c) p[c] *= inv;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < width; i += kResMixThreads) {
    float acc = 0.0f;
    for (int c = 0; c < nc; ++c) acc += ckpts.p[c][t * width + i] * p[c];
    out[t * width + i] = acc + cur[t * width + i] * p[nc];
  }
}

// A block owns kConvChannels channels (threadIdx.x) over all n tokens, cut into
// blockDim.y runs of tokens (threadIdx.y), each a thread's, in order, with the
// window of previous raw inputs in registers (the loops unroll to kMaxConv).
// Outputs overwrite x, so every run reads the raw inputs before its own (x's or
// the state's) before the barrier, and only then writes. One thread a channel
// walking all the tokens made 4096 threads for Kimi-K3's 4096 channels: 2.7 ms a
// call on a 4096-token prompt (H200, --profile-ops, 2026-12-04).
constexpr int kConvChannels = 32, kConvRuns = 32;
__global__ void short_conv_kernel(float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ state,
                                  int64_t n, int64_t width, int d_conv) {
  const int n_prev = d_conv - 1;
  const int64_t c = blockIdx.x * int64_t(kConvChannels) + threadIdx.x;
  const int64_t per = (n + blockDim.y - 1) / blockDim.y;
  const int64_t t0 = min(n, threadIdx.y * per), t1 = min(n, t0 + per);
  const bool mine = c < width && t0 < t1;
  float win[kMaxConv - 1];
#pragma unroll
  for (int j = 0; j < kMaxConv - 1; ++j) {
    const int64_t t = t0 - n_prev + j;  // win[n_prev - 1] is the newest
    win[j] = !mine || j >= n_prev ? 0.0f : t >= 0 ? x[t * width + c] : state[(t + n_prev) * width + c];
  }
  __syncthreads();
  if (!mine) return;
  const float* wc = weight + c * d_conv;
  for (int64_t t = t0; t < t1; ++t) {
    const float raw = x[t * width + c];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConv - 1; ++j)
      if (j < n_prev) sum += win[j] * wc[j];
    sum += raw * wc[n_prev];
#pragma unroll
    for (int j = 0; j < kMaxConv - 2; ++j)
      if (j + 1 < n_prev) win[j] = win[j + 1];
#pragma unroll
    for (int j = 0; j < kMaxConv - 1; ++j)
      if (j == n_prev - 1) win[j] = raw;
    x[t * width + c] = silu(sum);
  }
  if (t1 == n)  // the run with the last token: its window is the next call's state
#pragma unroll
    for (int j = 0; j < kMaxConv - 1; ++j)
      if (j < n_prev) state[j * width + c] = win[j];
}

__global__ void kda_gate_kernel(float* __restrict__ g, const float* __restrict__ dt_bias, const float* __restrict__ a,
                                int64_t n, int64_t width, int64_t head_dim, bool has_lower_bound, float lower_bound) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * width; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % width, h = i / head_dim;
    const float gi = g[e] + dt_bias[i];
    // ssm_a holds -exp(A_log); the lower bound swaps the activation for a scaled sigmoid
    if (has_lower_bound)
      g[e] = lower_bound * sigmoid(-(gi * a[h]));
    else
      g[e] = (gi > 20.0f ? gi : logf(1.0f + expf(gi))) * a[h];  // ggml_softplus
  }
}

// blockDim.x == head_dim: thread j owns value column j of S (S[i * hd + j]),
// so the state needs no synchronisation; the token's k, q and decay are shared.
__global__ void delta_rule_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                  const float* __restrict__ v, const float* __restrict__ g,
                                  const float* __restrict__ beta, float* __restrict__ state, float* __restrict__ o,
                                  int64_t n, int64_t n_head) {
  extern __shared__ float smem[];
  const int64_t hd = blockDim.x, h = blockIdx.x, D = n_head * hd, j = threadIdx.x;
  float* S = smem;
  float* ks = S + hd * hd;
  float* qs = ks + hd;
  float* dec = qs + hd;
  float* Sg = state + h * hd * hd;
  for (int64_t i = 0; i < hd; ++i) S[i * hd + j] = Sg[i * hd + j];
  for (int64_t t = 0; t < n; ++t) {
    const int64_t base = t * D + h * hd;
    ks[j] = k[base + j];
    qs[j] = q[base + j];
    dec[j] = expf(g[base + j]);
    __syncthreads();
    // S = diag(exp(g)) S, then S^T k in the CPU's order (key index ascending)
    float sk = 0.0f;
    for (int64_t i = 0; i < hd; ++i) {
      const float s = S[i * hd + j] * dec[i];
      S[i * hd + j] = s;
      sk += s * ks[i];
    }
    const float d = (v[base + j] - sk) * beta[t * n_head + h];
    float acc = 0.0f;
    for (int64_t i = 0; i < hd; ++i) {
      const float s = S[i * hd + j] + ks[i] * d;
      S[i * hd + j] = s;
      acc += s * qs[i];
    }
    o[base + j] = acc;
    __syncthreads();  // ks, qs, dec are rewritten for the next token
  }
  for (int64_t i = 0; i < hd; ++i) Sg[i * hd + j] = S[i * hd + j];
}

// One block per (query token, head), its 32 warps splitting every stage: the
// absorbed query (a warp per latent column), the scores (a warp per key, the
// lanes across the latent), softmax (sum in double), the latent mix (each warp
// a share of the keys for every column; warp w + 16's partials added to warp
// w's, then those 16 summed in warp order), the value expansion (a warp per
// output). A thread per key and a thread per column over every key, in
// sequence, took 0.96 ms of a decode step at 2048 tokens of context and 580 ms
// of a 2048-token prefill; 8 warps per block still added 1.9 ms to a 3-layer
// decode step from 512 to 4096 tokens of context (H200): a decode step has
// one block per head, too few to hide the keys' load latency with 8 warps.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kMlaThreads = 1024;
constexpr int kMlaWarps = kMlaThreads / 32;
// Rows of partial sums the mix keeps in shared memory (half the warps: the
// upper half's are folded into the lower half's first), so the keys that fit
// are as many as with 16 warps.
constexpr int kMlaPartRows = kMlaWarps / 2;
constexpr int kMlaCols = 16;  // latent columns a lane sums in the mix, per pass

__global__ void __launch_bounds__(kMlaThreads) mla_kernel(MlaArgs a) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x, h = blockIdx.y, H = a.n_head, kv = a.kv, nope = a.nope, rope = a.rope;
  const int64_t hk = nope + rope, n_keys = a.pos0 + t + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* qa = smem;
  float* lt = qa + kv;
  float* part = lt + kv;                // [kMlaPartRows][kv]
  float* sc = part + kMlaPartRows * kv;  // [n_keys]
  const float* Q = a.q + (t * H + h) * hk;
  for (int64_t c = warp; c < kv; c += kMlaWarps) {
    const float* wk = a.k_b + (h * kv + c) * nope;
    float s = 0.0f;
    for (int64_t i = lane; i < nope; i += 32) s += wk[i] * Q[i];
    s = warp_sum(s);
    if (lane == 0) qa[c] = s;
  }
  __syncthreads();
  for (int64_t p = warp; p < n_keys; p += kMlaWarps) {
    const float* c = a.latent + p * kv;
    const float* kr = a.rope_key + p * rope;
    float s = 0.0f;  // one dot over [latent | rope key]
    for (int64_t i = lane; i < kv; i += 32) s += qa[i] * c[i];
    for (int64_t i = lane; i < rope; i += 32) s += Q[nope + i] * kr[i];
    s = warp_sum(s);
    if (lane == 0) sc[p] = s * a.scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t p = threadIdx.x; p < n_keys; p += kMlaThreads) mx = fmaxf(mx, sc[p]);
  mx = block_max(mx);
  double sum = 0.0;
  for (int64_t p = threadIdx.x; p < n_keys; p += kMlaThreads) {
    sc[p] = expf(sc[p] - mx);
    sum += sc[p];
  }
  const float inv = float(1.0 / block_sum(sum));
  for (int64_t p = threadIdx.x; p < n_keys; p += kMlaThreads) sc[p] *= inv;
  __syncthreads();
  for (int64_t c0 = 0; c0 < kv; c0 += 32 * kMlaCols) {
    float acc[kMlaCols];
    for (int j = 0; j < kMlaCols; ++j) acc[j] = 0.0f;
    for (int64_t p = warp; p < n_keys; p += kMlaWarps) {
      const float w = sc[p];
      const float* row = a.latent + p * kv + c0 + lane;
#pragma unroll
      for (int j = 0; j < kMlaCols; ++j)
        if (c0 + lane + 32 * j < kv) acc[j] += w * row[32 * j];
    }
    const int prow = warp % kMlaPartRows;
    if (warp >= kMlaPartRows) {
#pragma unroll
      for (int j = 0; j < kMlaCols; ++j)
        if (c0 + lane + 32 * j < kv) part[prow * kv + c0 + lane + 32 * j] = acc[j];
    }
    __syncthreads();
    if (warp < kMlaPartRows) {
#pragma unroll
      for (int j = 0; j < kMlaCols; ++j)
        if (c0 + lane + 32 * j < kv) part[prow * kv + c0 + lane + 32 * j] += acc[j];
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < kv; c += kMlaThreads) {
    float s = 0.0f;
    for (int w = 0; w < kMlaPartRows; ++w) s += part[w * kv + c];
    lt[c] = s;
  }
  __syncthreads();
  for (int64_t oi = warp; oi < a.hv; oi += kMlaWarps) {
    const float* wv = a.v_b + (h * a.hv + oi) * kv;
    float s = 0.0f;
    for (int64_t c = lane; c < kv; c += 32) s += wv[c] * lt[c];
    s = warp_sum(s);
    if (lane == 0) a.o[(t * H + h) * a.hv + oi] = s;
  }
}

}  // namespace

cudaError_t res_mix(const float* cur, const float* const* ckpts, int n_ckpts, const float* score_w, int64_t n,
                    int64_t width, float eps, float* out, cudaStream_t stream) {
  if (n_ckpts < 0 || n_ckpts > kMaxCkpts || width <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  Ckpts c{};
  for (int i = 0; i < n_ckpts; ++i) c.p[i] = ckpts[i];
  res_mix_kernel<<<unsigned(n), kResMixThreads, 0, stream>>>(cur, c, n_ckpts, score_w, width, eps, out);
  return launched();
}

cudaError_t short_conv_silu(float* x, const float* weight, float* state, int64_t n, int64_t width, int d_conv,
                            cudaStream_t stream) {
  if (d_conv < 1 || d_conv > kMaxConv || width <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if ((width + kConvChannels - 1) / kConvChannels > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const dim3 block{kConvChannels, unsigned(std::min<int64_t>(n, kConvRuns))};
  short_conv_kernel<<<unsigned((width + kConvChannels - 1) / kConvChannels), block, 0, stream>>>(x, weight, state, n,
                                                                                                  width, d_conv);
  return launched();
}

cudaError_t kda_gate(float* g, const float* dt_bias, const float* a, int64_t n, int64_t width, int64_t head_dim,
                     bool has_lower_bound, float lower_bound, cudaStream_t stream) {
  if (head_dim <= 0 || width % head_dim != 0) return cudaErrorInvalidValue;
  if (n * width == 0) return cudaSuccess;
  kda_gate_kernel<<<grid_for(n * width), kThreads, 0, stream>>>(g, dt_bias, a, n, width, head_dim, has_lower_bound,
                                                                lower_bound);
  return launched();
}

namespace {
int64_t delta_smem(int64_t hd) { return (hd * hd + 3 * hd) * int64_t(sizeof(float)); }
}  // namespace

int64_t delta_rule_max_head_dim() {
  const int64_t optin = smem_optin();
  int64_t hd = 1;
  while (hd + 1 <= 1024 && delta_smem(hd + 1) <= optin) ++hd;
  return hd;
}

cudaError_t delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                       float* state, float* o, int64_t n, int64_t n_head, int64_t head_dim, cudaStream_t stream) {
  if (head_dim <= 0 || head_dim > 1024 || n_head <= 0 || delta_smem(head_dim) > smem_optin())
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t bytes = delta_smem(head_dim);
  if (bytes > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(delta_rule_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
  }
  delta_rule_kernel<<<unsigned(n_head), unsigned(head_dim), size_t(bytes), stream>>>(q, k, v, g, beta, state, o, n,
                                                                                    n_head);
  return launched();
}

// ---- the chunked delta rule -------------------------------------------------

namespace {

// e^x for a log decay x <= 0, zero below e^-60 (as models/kimi_k3/kda_cpu.cpp):
// far under float's resolution next to what it is summed with.
constexpr double kFlushBelow = -60.0;
__device__ __forceinline__ float decay_factor(double x) { return x < kFlushBelow ? 0.0f : expf(float(x)); }

constexpr int kPrepThreads = 256;
constexpr int kSeqThreads = 256;  // 8 warps
constexpr int64_t kVT = 32;       // value columns per block of the state pass (one per lane)
constexpr int64_t kRowGroups = kSeqThreads / 32;
constexpr int64_t kMaxRowsPerThread = kMaxChunk / kRowGroups;
constexpr int64_t kSegmentTokens = 512;

// One (chunk, head)'s products in the scratch, in floats:
// Qbar, Ktilde, W, U [C][hd], B [C][C], e^G_last [hd].
__host__ __device__ inline int64_t chunk_record(int64_t C, int64_t hd) { return 4 * C * hd + C * C + hd; }

int64_t prep_smem(int64_t C, int64_t hd) {
  const int64_t P = hd + 1;
  return C * P * int64_t(sizeof(double)) + 2 * C * P * int64_t(sizeof(float)) + C * C * int64_t(sizeof(float));
}
int64_t seq_smem(int64_t C, int64_t hd) {
  return (hd * (kVT + 1) + 3 * C * hd + C * C + C * kVT + hd) * int64_t(sizeof(float));
}

// Block (c, h): the chunk of tokens [t_begin + c C, + L). Rows of k, q, v and G
// in shared memory with a padded stride (hd + 1) so that a warp's different rows
// fall in different banks.
__global__ void delta_chunk_prep_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, const float* __restrict__ g,
                                        const float* __restrict__ beta, int64_t t_begin, int64_t t_end,
                                        int64_t n_head, int64_t hd, int64_t C, float* __restrict__ scratch) {
  extern __shared__ double dsm[];
  const int64_t c = blockIdx.x, h = blockIdx.y, H = n_head, D = H * hd, P = hd + 1;
  const int64_t t0 = t_begin + c * C, L = min(C, t_end - t0);
  double* Gd = dsm;                                 // [C][P]  running sum of g from the chunk's start
  float* Kx = reinterpret_cast<float*>(Gd + C * P);  // [C][P]  k, then Kbar, then W
  float* Vx = Kx + C * P;                            // [C][P]  q, then v, then U
  float* A = Vx + C * P;                             // [C][C]
  float* rec = scratch + (c * H + h) * chunk_record(C, hd);
  float *Qb = rec, *Kt = rec + C * hd, *Wm = rec + 2 * C * hd, *Um = rec + 3 * C * hd, *Bm = rec + 4 * C * hd;
  float* eGL = Bm + C * C;
  const int tid = threadIdx.x;
  for (int64_t e = tid; e < L * hd; e += kPrepThreads) {
    const int64_t r = e / hd, i = e % hd, src = (t0 + r) * D + h * hd + i;
    Kx[r * P + i] = k[src];
    Vx[r * P + i] = q[src];
  }
  for (int64_t i = tid; i < hd; i += kPrepThreads) {
    double acc = 0.0;
    for (int64_t r = 0; r < L; ++r) {
      acc += double(g[(t0 + r) * D + h * hd + i]);
      Gd[r * P + i] = acc;
    }
  }
  __syncthreads();
  // the lower triangles (s <= r) of A (kept) and B (to the record), a pair per thread
  const int64_t n_pairs = L * (L + 1) / 2;
  for (int64_t p = tid; p < n_pairs; p += kPrepThreads) {
    int64_t r = int64_t((sqrt(8.0 * double(p) + 1.0) - 1.0) * 0.5);
    while (r * (r + 1) / 2 > p) --r;
    while ((r + 1) * (r + 2) / 2 <= p) ++r;
    const int64_t s = p - r * (r + 1) / 2;
    float a = 0.0f, b = 0.0f;
    for (int64_t i = 0; i < hd; ++i) {
      const float kf = Kx[s * P + i] * decay_factor(Gd[r * P + i] - Gd[s * P + i]);
      a += Kx[r * P + i] * kf;
      b += Vx[r * P + i] * kf;
    }
    A[r * C + s] = a;
    Bm[r * C + s] = b;
  }
  __syncthreads();
  for (int64_t e = tid; e < L * hd; e += kPrepThreads) {
    const int64_t r = e / hd, i = e % hd;
    const double G = Gd[r * P + i];
    const float e1 = decay_factor(G);
    Qb[r * hd + i] = Vx[r * P + i] * e1;
    Kt[r * hd + i] = Kx[r * P + i] * decay_factor(Gd[(L - 1) * P + i] - G);
    Kx[r * P + i] *= e1;
    Vx[r * P + i] = v[(t0 + r) * D + h * hd + i];
  }
  for (int64_t i = tid; i < hd; i += kPrepThreads) eGL[i] = decay_factor(Gd[(L - 1) * P + i]);
  __syncthreads();
  // (I + diag(beta) A) X = diag(beta) [V | Kbar]: one column per thread
  for (int64_t col = tid; col < 2 * hd; col += kPrepThreads) {
    float* X = col < hd ? Vx + col : Kx + (col - hd);
    for (int64_t r = 0; r < L; ++r) {
      float x = X[r * P];
      for (int64_t s = 0; s < r; ++s) x -= A[r * C + s] * X[s * P];
      X[r * P] = x * beta[(t0 + r) * H + h];
    }
  }
  __syncthreads();
  for (int64_t e = tid; e < L * hd; e += kPrepThreads) {
    const int64_t r = e / hd, i = e % hd;
    Um[r * hd + i] = Vx[r * P + i];
    Wm[r * hd + i] = Kx[r * P + i];
  }
}

// Block (h, value tile): the state's columns [j0, j0 + 32) of head h through the
// segment's chunks. Lane = value column; in the first pass warp w takes rows
// w, w + 8, ..; in the state update lanes take key rows, warp w columns 4w..4w+3.
__global__ void __launch_bounds__(kSeqThreads) delta_chunk_seq_kernel(const float* __restrict__ scratch,
                                                                      float* __restrict__ state, float* __restrict__ o,
                                                                      int64_t t_begin, int64_t t_end, int64_t n_head,
                                                                      int64_t hd, int64_t C) {
  extern __shared__ float sm[];
  constexpr int64_t SP = kVT + 1;  // padded: the state update's lanes read down a column
  const int64_t h = blockIdx.x, j0 = blockIdx.y * kVT, H = n_head, D = H * hd;
  const int64_t vt = min(kVT, hd - j0);
  float* S = sm;              // [hd][SP]
  float* Ws = S + hd * SP;    // [C][hd]  (hd % 4 == 0: rows 16-byte aligned)
  float* Qs = Ws + C * hd;    // [C][hd]
  float* Ks = Qs + C * hd;    // [C][hd]
  float* Bs = Ks + C * hd;    // [C][C]
  float* Dl = Bs + C * C;     // [C][kVT] the chunk's deltas (C % 4 == 0: aligned)
  float* eg = Dl + C * kVT;   // [hd]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* Sg = state + h * hd * hd;
  for (int64_t e = tid; e < hd * kVT; e += kSeqThreads) {
    const int64_t i = e / kVT, j = e % kVT;
    S[i * SP + j] = j < vt ? Sg[i * hd + j0 + j] : 0.0f;
  }
  const int64_t n_chunks = (t_end - t_begin + C - 1) / C;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t t0 = t_begin + c * C, L = min(C, t_end - t0);
    const float* rec = scratch + (c * H + h) * chunk_record(C, hd);
    __syncthreads();  // the previous chunk is done with the staged rows and S
    for (int64_t e = tid; e < L * hd; e += kSeqThreads) {
      Qs[e] = rec[e];
      Ks[e] = rec[C * hd + e];
      Ws[e] = rec[2 * C * hd + e];
    }
    for (int64_t e = tid; e < L * C; e += kSeqThreads) Bs[e] = rec[4 * C * hd + e];
    for (int64_t i = tid; i < hd; i += kSeqThreads) eg[i] = rec[4 * C * hd + C * C + i];
    __syncthreads();
    // D = U - W S and Qbar S, rows warp + 8 m, column lane
    float accD[kMaxRowsPerThread], accO[kMaxRowsPerThread];
#pragma unroll
    for (int m = 0; m < kMaxRowsPerThread; ++m) accD[m] = accO[m] = 0.0f;
    for (int64_t i = 0; i < hd; i += 4) {
      const float s0 = S[i * SP + lane], s1 = S[(i + 1) * SP + lane], s2 = S[(i + 2) * SP + lane],
                  s3 = S[(i + 3) * SP + lane];
#pragma unroll
      for (int m = 0; m < kMaxRowsPerThread; ++m) {
        const int64_t r = warp + kRowGroups * m;
        if (r < L) {
          const float4 w = *reinterpret_cast<const float4*>(Ws + r * hd + i);
          const float4 qb = *reinterpret_cast<const float4*>(Qs + r * hd + i);
          accD[m] = accD[m] + w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
          accO[m] = accO[m] + qb.x * s0 + qb.y * s1 + qb.z * s2 + qb.w * s3;
        }
      }
    }
    const float* Um = rec + 3 * C * hd;
#pragma unroll
    for (int m = 0; m < kMaxRowsPerThread; ++m) {
      const int64_t r = warp + kRowGroups * m;
      if (r < L) Dl[r * kVT + lane] = (lane < vt ? Um[r * hd + j0 + lane] : 0.0f) - accD[m];
    }
    __syncthreads();
    // O = Qbar S + B D
#pragma unroll
    for (int m = 0; m < kMaxRowsPerThread; ++m) {
      const int64_t r = warp + kRowGroups * m;
      if (r < L) {
        float acc = accO[m];
        for (int64_t s = 0; s <= r; ++s) acc += Bs[r * C + s] * Dl[s * kVT + lane];
        if (lane < vt) o[(t0 + r) * D + h * hd + j0 + lane] = acc;
      }
    }
    // S = diag(e^G_last) S + Ktilde^T D: key rows lane + 32 a, columns 4 warp + b
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int64_t i = lane + 32 * a;
#pragma unroll
      for (int b = 0; b < 4; ++b) acc[a][b] = i < hd ? eg[i] * S[i * SP + 4 * warp + b] : 0.0f;
    }
    for (int64_t r = 0; r < L; ++r) {
      const float4 d = *reinterpret_cast<const float4*>(Dl + r * kVT + 4 * warp);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int64_t i = lane + 32 * a;
        const float kt = i < hd ? Ks[r * hd + i] : 0.0f;
        acc[a][0] += kt * d.x;
        acc[a][1] += kt * d.y;
        acc[a][2] += kt * d.z;
        acc[a][3] += kt * d.w;
      }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int64_t i = lane + 32 * a;
      if (i < hd) {
#pragma unroll
        for (int b = 0; b < 4; ++b) S[i * SP + 4 * warp + b] = acc[a][b];
      }
    }
  }
  __syncthreads();
  for (int64_t e = tid; e < hd * kVT; e += kSeqThreads) {
    const int64_t i = e / kVT, j = e % kVT;
    if (j < vt) Sg[i * hd + j0 + j] = S[i * SP + j];
  }
}

bool chunked_shape_ok(int64_t n_head, int64_t hd, int64_t C) {
  return n_head > 0 && n_head <= 65535 && hd > 0 && hd % 4 == 0 && hd <= kChunkMaxHeadDim && C > 0 && C % 4 == 0 &&
         C <= kMaxChunk;
}

}  // namespace

int64_t delta_chunk_segment(int64_t chunk) {
  return chunk <= 0 ? 0 : std::max<int64_t>(1, kSegmentTokens / chunk) * chunk;
}

int64_t delta_chunk_scratch_floats(int64_t n, int64_t n_head, int64_t head_dim, int64_t chunk) {
  if (n <= 0 || !chunked_shape_ok(n_head, head_dim, chunk)) return 0;
  const int64_t seg = std::min(n, delta_chunk_segment(chunk));
  return (seg + chunk - 1) / chunk * n_head * chunk_record(chunk, head_dim);
}

cudaError_t delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               float* state, float* o, int64_t n, int64_t n_head, int64_t head_dim, int64_t chunk,
                               float* scratch, cudaStream_t stream) {
  const int64_t hd = head_dim, C = chunk;
  if (!chunked_shape_ok(n_head, hd, C) || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t prep_bytes = prep_smem(C, hd), seq_bytes = seq_smem(C, hd), optin = smem_optin();
  if (prep_bytes > optin || seq_bytes > optin) return cudaErrorInvalidValue;
  if (prep_bytes > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(delta_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep_bytes));
    if (e != cudaSuccess) return e;
  }
  if (seq_bytes > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(delta_chunk_seq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(seq_bytes));
    if (e != cudaSuccess) return e;
  }
  const int64_t seg = delta_chunk_segment(C);
  for (int64_t t_begin = 0; t_begin < n; t_begin += seg) {
    const int64_t t_end = std::min(n, t_begin + seg), n_chunks = (t_end - t_begin + C - 1) / C;
    delta_chunk_prep_kernel<<<dim3(unsigned(n_chunks), unsigned(n_head)), kPrepThreads, size_t(prep_bytes), stream>>>(
        q, k, v, g, beta, t_begin, t_end, n_head, hd, C, scratch);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    delta_chunk_seq_kernel<<<dim3(unsigned(n_head), unsigned((hd + kVT - 1) / kVT)), kSeqThreads, size_t(seq_bytes),
                             stream>>>(scratch, state, o, t_begin, t_end, n_head, hd, C);
    const cudaError_t e2 = cudaGetLastError();
    if (e2 != cudaSuccess) return e2;
  }
  return cudaSuccess;
}

int64_t mla_max_keys(int64_t kv) {
  return std::max<int64_t>(0, (smem_optin() - kStaticSmem) / int64_t(sizeof(float)) - (2 + kMlaPartRows) * kv);
}

cudaError_t mla_attention(const MlaArgs& a, cudaStream_t stream) {
  if (a.n_head <= 0 || a.kv <= 0 || a.hv <= 0 || a.nope < 0 || a.rope < 0 || a.pos0 < 0 ||
      a.pos0 + a.n > mla_max_keys(a.kv) || a.n_head > 65535)
    return cudaErrorInvalidValue;
  if (a.n == 0) return cudaSuccess;
  const int64_t bytes = ((2 + kMlaPartRows) * a.kv + a.pos0 + a.n) * int64_t(sizeof(float));
  if (bytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
  }
  mla_kernel<<<dim3(unsigned(a.n), unsigned(a.n_head)), kMlaThreads, size_t(bytes), stream>>>(a);
  return launched();
}

}  // namespace xpack::rt::kimi
