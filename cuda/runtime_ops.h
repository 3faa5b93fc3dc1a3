// GPU kernels of the runtime's named operations (examples/xpack-run/backend.h)
// other than the matrix products (quant_matmul.h): gathers, norms, elementwise
// functions, RoPE, softmax, top-k, the attention core and the routed-experts
// scatter/sum. Plain C++ over the CUDA runtime API, usable from any C++ file.
//
// Numerics follow the CPU backend's (examples/xpack-run/cpu_ops.cpp) operation
// by operation: the same float expressions (runtime_ops.cu is compiled without
// FMA contraction), sums of squares and softmax denominators in double, and the
// same sequential orders where the CPU's order is part of the contract
// (normalize_rows, combine_picks, attention's weighted sum). Only the parallel
// double-precision reductions and the device's expf/cosf/sinf (<= 2 ulp) differ.
//
// Every function enqueues on `stream`, returns at once and reports a launch
// error as its cudaError_t; shapes are checked by the caller (the backend).
// Ids are trusted to be in range (graphs produce them; token ids are checked
// before upload).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace xpack::rt {

// dst[r] = src[ids[r]] for rows of `width` 32-bit words (F32 or I32).
cudaError_t gather_words(const uint32_t* src, int64_t width, const int32_t* ids, int64_t n, uint32_t* dst,
                         cudaStream_t stream);
// dst[r] = the row ids[r] of a GGUF-block table (any type of quant_matmul.h,
// rows of `row_bytes`), dequantized to fp32 exactly as the CPU's decoders do.
// cudaErrorInvalidValue for a type without a decoder.
cudaError_t get_rows_dequant(uint32_t type, const void* table, size_t row_bytes, int64_t width, const int32_t* ids,
                             int64_t n, float* dst, cudaStream_t stream);
// dst[ids[r]] = src[r] (F32 rows of `width`).
cudaError_t set_rows(const float* src, int64_t width, const int32_t* ids, int64_t n, float* dst,
                     cudaStream_t stream);
// Per row: y = x / sqrt(mean(x^2) + eps) * w (w may be null). y may be x.
cudaError_t rms_norm(const float* x, const float* w, int64_t width, int64_t rows, float eps, float* y,
                     cudaStream_t stream);
// Per row: y = x / max(||x||, eps). y may be x.
cudaError_t l2_norm(const float* x, int64_t width, int64_t rows, float eps, float* y, cudaStream_t stream);
// out = a + b, b either [rows][width] or one row (b_rows == 1). out may be a.
cudaError_t add(const float* a, const float* b, int64_t width, int64_t rows, int64_t b_rows, float* out,
                cudaStream_t stream);
cudaError_t mul(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream);
cudaError_t scale(const float* x, float s, int64_t n, float* out, cudaStream_t stream);
// kind 0: sigmoid, 1: sqrt(softplus) (log1p form; x > 20 taken as is).
cudaError_t unary(int kind, const float* x, int64_t n, float* out, cudaStream_t stream);
// silu(min(gate, limit)) * clamp(up, -limit, limit); limit <= 1e-6: plain SwiGLU.
cudaError_t swiglu(const float* gate, const float* up, int64_t n, float limit, float* out, cudaStream_t stream);

// rope_yarn_cache's per-call constants, computed on the host exactly as the CPU does.
struct RopeParams {
  int n_dims;
  float theta_scale;  // freq_base^(-2 / n_dims)
  float freq_scale;
  float ext_factor;
  float attn_factor;  // the magnitude without YaRN's ramp
  float mscale_ext;   // attn_factor * (1 + 0.1 log(1 / freq_scale)), used when ext_factor != 0
  float corr0, corr1;
};
// In place: in every head_dim-wide head of each row, dims [offset, offset + n_dims)
// rotated in adjacent pairs at position pos0 + row * pos_step.
cudaError_t rope(float* x, int64_t width, int64_t rows, int64_t head_dim, int64_t offset, const RopeParams& p,
                 int64_t pos0, int64_t pos_step, bool inverse, cudaStream_t stream);

// In place, per row: every head_dim-wide head normed as rms_norm() does (w:
// head_dim floats or null), then rotated as rope() at position pos0 + row.
// head_dim and offset must be even (cudaErrorInvalidValue otherwise).
cudaError_t rms_norm_rope(float* x, const float* w, int64_t width, int64_t rows, int64_t head_dim, int64_t offset,
                          float eps, const RopeParams& p, int64_t pos0, cudaStream_t stream);

// In place, per row: exp(x - max) / sum.
cudaError_t softmax_rows(float* x, int64_t width, int64_t rows, cudaStream_t stream);
// In place, the scores of a batched attention: row r (of `ld` columns) belongs to
// group g = r / n_head (a query token) and head r % n_head, and its first
// counts[g] columns (counts: a DEVICE array; null: first_count + g, a causal
// prompt) are its keys: exp(x - max) / sum over them, with the head's sink
// logit (sinks: n_head floats, or null for none) in the max and the sum; every
// later column is set to 0.
cudaError_t masked_softmax_rows(float* s, int64_t ld, int64_t rows, int64_t n_head, const int32_t* counts,
                                int64_t first_count, const float* sinks, cudaStream_t stream);
// ids[r][j]: the k largest of scores[r], largest first, ties to the lower index.
cudaError_t top_k(const float* scores, int64_t n, int64_t rows, int64_t k, int32_t* ids, cudaStream_t stream);
// out[r][j] = values[r][ids[r][j]].
cudaError_t take(const float* values, int64_t n, const int32_t* ids, int64_t k, int64_t rows, float* out,
                 cudaStream_t stream);
// In place, per row of k: x /= max(sum (double, left to right), floor).
cudaError_t normalize_rows(float* x, int64_t k, int64_t rows, float floor, cudaStream_t stream);

// Backend::route in one launch, a block per row: logits [rows][n] gated in
// place (gate: -1 none, else unary's kind); with `select` ids [rows][k] = the
// top k of logits + bias (bias: n floats or null), else ids are read; weights
// [rows][k] = logits at ids, normalised (normalize_rows) and scaled (unless
// scale is 0 or 1). cudaErrorInvalidValue when n exceeds route_max_experts().
int64_t route_max_experts();
cudaError_t route(float* logits, int64_t n, int64_t rows, int gate, const float* bias, bool select, int64_t k,
                  bool normalize, float floor, float scale, int32_t* ids, float* weights, cudaStream_t stream);

// Causal GQA core (Backend::attention). Scores of one (token, head) live in
// shared memory when n_kv fits attention_smem_positions(), otherwise in
// `scratch` (n * n_head * n_kv floats; may be null when they fit).
int64_t attention_smem_positions();
cudaError_t attention(const float* q, const float* k, const float* v, int64_t n, int64_t n_head, int64_t n_head_kv,
                      int64_t head_dim, int64_t pos0, float scale, float* out, float* scratch, cudaStream_t stream);

// out[t] = ys[rows[t*k]] * weights[t*k] + ... (rank order, each product
// rounded) (+ out[t] with accumulate), rows of d.
cudaError_t combine_picks(const float* ys, int64_t d, const int32_t* rows, const float* weights, int64_t k,
                          int64_t n_tokens, bool accumulate, float* out, cudaStream_t stream);

}  // namespace xpack::rt
