// deepseek4's lightning indexer on the GPU (ds4_kernels.h's indexer_select):
// the blocks of compressed keys each query attends to. Built with
// --fmad=false (cuda/meson.build) so each score rounds as the CPU's does and
// the choice is the CPU's, ties included.
#include <algorithm>
#include <cmath>

#include "ds4_kernels.h"
#include "ds4_visible.cuh"

namespace xpack::rt::ds4 {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16)));
}

cudaError_t launched() { return cudaGetLastError(); }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Sequential float dot product: the CPU's order, so scores agree bit for bit.
__device__ float dot_seq(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}


// score[t][b] = sum_h w[t][h] * relu(q[t][h] . key[b]), the h sum in double in
// head order, for the visible blocks of queries that must choose.
__global__ void indexer_score_kernel(const float* q, const float* w, const float* keys, int64_t n_blocks, int64_t n,
                                     int64_t n_head, int64_t id, int64_t pos0, int64_t ratio, int64_t top_k,
                                     float* scores) {
  GRID_STRIDE(e, n * n_blocks) {
    const int64_t t = e / n_blocks, b = e - t * n_blocks;
    const int64_t n_vis = visible_blocks(pos0 + t, ratio, n_blocks);
    if (n_vis <= top_k || b >= n_vis) continue;
    const float* qt = q + t * n_head * id;
    const float* k = keys + b * id;
    double s = 0.0;
    for (int64_t h = 0; h < n_head; ++h) s += static_cast<double>(fmaxf(0.0f, dot_seq(qt + h * id, k, id)) * w[t * n_head + h]);
    scores[e] = static_cast<float>(s);
  }
}

// One block per query: block b is chosen when fewer than top_k blocks come
// before it in (score descending, index ascending) order; the chosen ones are
// then written in ascending index order.
__global__ void indexer_choose_kernel(const float* scores, int32_t* flags, int64_t n_blocks, int64_t pos0,
                                      int64_t ratio, int64_t top_k, int32_t* chosen) {
  const int64_t t = blockIdx.x;
  const int64_t n_vis = visible_blocks(pos0 + t, ratio, n_blocks);
  int32_t* out = chosen + t * top_k;
  for (int64_t j = threadIdx.x; j < top_k; j += blockDim.x) out[j] = (n_vis <= top_k && j < n_vis) ? int32_t(j) : -1;
  if (n_vis <= top_k) return;
  const float* s = scores + t * n_blocks;
  int32_t* f = flags + t * n_blocks;
  for (int64_t b = threadIdx.x; b < n_vis; b += blockDim.x) {
    const float sb = s[b];
    int64_t before = 0;
    for (int64_t o = 0; o < n_vis; ++o) before += (s[o] > sb || (s[o] == sb && o < b)) ? 1 : 0;
    f[b] = before < top_k ? 1 : 0;
  }
  __syncthreads();
  for (int64_t b = threadIdx.x; b < n_vis; b += blockDim.x) {
    if (!f[b]) continue;
    int64_t at = 0;
    for (int64_t o = 0; o < b; ++o) at += f[o];
    if (at < top_k) out[at] = int32_t(b);
  }
}

}  // namespace

cudaError_t indexer_select(const float* q, const float* w, const float* keys, int64_t n_blocks, int64_t n,
                           int64_t n_head, int64_t head_dim, int64_t pos0, int64_t ratio, int64_t top_k,
                           float* scores, int32_t* flags, int32_t* chosen, cudaStream_t cs) {
  if (n == 0 || top_k == 0) return cudaSuccess;
  if (n_blocks > top_k) {
    indexer_score_kernel<<<grid_for(n * n_blocks), kThreads, 0, cs>>>(q, w, keys, n_blocks, n, n_head, head_dim, pos0,
                                                                      ratio, top_k, scores);
    const cudaError_t e = launched();
    if (e != cudaSuccess) return e;
  }
  indexer_choose_kernel<<<unsigned(n), kThreads, 0, cs>>>(scores, flags, n_blocks, pos0, ratio, top_k, chosen);
  return launched();
}

}  // namespace xpack::rt::ds4
