// GPU kernels of kimi-k3's own operations (examples/xpack-run/models/kimi_k3/
// kimi_ops.h): cross-layer residual attention's mix, KDA's short convolution,
// decay gate and gated delta rule, and the absorbed MLA attention core (situ
// is kernels::situ_mul). Plain C++ over the CUDA runtime API; the graph-side
// wrapper is models/kimi_k3/kimi_ops_cuda.cpp.
//
// Numerics follow the CPU versions (models/kimi_k3/*_cpu.cpp) expression by
// expression (built with --fmad=false): float sums run in the CPU's order, one
// thread per output; the sums the CPU keeps in double are in double here (as
// parallel block sums: a different order, but rounded to float the same to
// within double's error).
//
// Every function enqueues on `stream`, returns at once and reports a launch
// error as its cudaError_t (cudaErrorInvalidValue for a shape over the limits
// below); shapes are checked by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace xpack::rt::kimi {

// The most checkpoints res_mix takes (they travel as a kernel parameter).
constexpr int kMaxCkpts = 64;
// The longest short convolution (its window lives in registers).
constexpr int kMaxConv = 16;

// out[t] = sum_c p_c ckpts[c][t] + p_h cur[t], p = softmax of the rms-normed
// rows' dot with score_w; all rows [n][width].
cudaError_t res_mix(const float* cur, const float* const* ckpts, int n_ckpts, const float* score_w, int64_t n,
                    int64_t width, float eps, float* out, cudaStream_t stream);

// In place on x [n][width]: causal depthwise conv (weight [width][d_conv]) from
// state [d_conv - 1][width], silu; state keeps the last d_conv - 1 raw inputs.
cudaError_t short_conv_silu(float* x, const float* weight, float* state, int64_t n, int64_t width, int d_conv,
                            cudaStream_t stream);

// In place on g [n][width]: g += dt_bias, then the lower-bound sigmoid or softplus * a[head].
cudaError_t kda_gate(float* g, const float* dt_bias, const float* a, int64_t n, int64_t width, int64_t head_dim,
                     bool has_lower_bound, float lower_bound, cudaStream_t stream);

// Gated delta rule: one block per head, its state S [head_dim][head_dim] in
// shared memory, the tokens in order (thread j owns value column j of S).
// q, k, v, g, o [n][n_head * head_dim], beta [n][n_head], state [n_head][hd * hd].
// head_dim up to delta_rule_max_head_dim().
int64_t delta_rule_max_head_dim();
cudaError_t delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                       float* state, float* o, int64_t n, int64_t n_head, int64_t head_dim, cudaStream_t stream);

// The chunked delta rule (kimi_ops.h's delta_rule_chunked): the same arguments
// and result as delta_rule, over chunks of `chunk` tokens, in segments of at most
// delta_chunk_segment(chunk) tokens. Per segment, one kernel per (chunk, head)
// forms the chunk's products (A and B's lower triangles with pairwise factors
// e^(G_r - G_s), G in double; one forward substitution for U = T V and W = T Kbar;
// Qbar, Ktilde, e^G_last) into `scratch`, then one block per (head, 32 value
// columns) carries its slice of the state through the chunks: D = U - W S,
// O = Qbar S + B D, S = diag(e^G_last) S + Ktilde^T D. Factors under e^-60 are
// zero. head_dim: a multiple of 4 up to kChunkMaxHeadDim; chunk: a multiple of 4
// up to kMaxChunk; scratch: delta_chunk_scratch_floats(n, ...) floats.
constexpr int64_t kChunkMaxHeadDim = 128;
constexpr int64_t kMaxChunk = 64;
int64_t delta_chunk_segment(int64_t chunk);
int64_t delta_chunk_scratch_floats(int64_t n, int64_t n_head, int64_t head_dim, int64_t chunk);
cudaError_t delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               float* state, float* o, int64_t n, int64_t n_head, int64_t head_dim, int64_t chunk,
                               float* scratch, cudaStream_t stream);

// Absorbed MLA: one block per (query, head), the scores of its keys in shared
// memory (query t sees pos0 + t + 1 keys: pos0 + n up to mla_max_keys(kv)).
struct MlaArgs {
  const float* q = nullptr;         // [n][n_head * (nope + rope)]
  const float* latent = nullptr;    // [n_kv][kv]
  const float* rope_key = nullptr;  // [n_kv][rope]
  const float* k_b = nullptr;       // [n_head * kv][nope]
  const float* v_b = nullptr;       // [n_head * hv][kv]
  int64_t n = 0, n_head = 0, nope = 0, rope = 0, kv = 0, hv = 0, pos0 = 0;
  float scale = 1.0f;
  float* o = nullptr;  // [n][n_head * hv]
};
int64_t mla_max_keys(int64_t kv);
cudaError_t mla_attention(const MlaArgs& a, cudaStream_t stream);

}  // namespace xpack::rt::kimi
