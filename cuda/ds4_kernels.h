// GPU kernels of deepseek4's own operations (examples/xpack-run/models/deepseek4/
// ds4_ops.h): hyper-connection mixing with Sinkhorn, the compressor's block
// pooling, the lightning indexer's block choice and the attention core over a
// sliding window plus compressed blocks with per-head sinks. Plain C++ over the
// CUDA runtime API; the graph-side wrapper is models/deepseek4/ds4_ops_cuda.cpp.
//
// Numerics follow the CPU versions (models/deepseek4/*_cpu.cpp) expression by
// expression (built with --fmad=false): dot products are sequential float sums
// as on the CPU, so the indexer's scores and hence its choices are the CPU's
// bit for bit; the sums the CPU keeps in double are in double here too (the
// softmax denominators as parallel double sums, the others in the CPU's order).
//
// Every function enqueues on `stream`, returns at once and reports a launch
// error as its cudaError_t; shapes and ranges are checked by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace xpack::rt::ds4 {

// The largest hc (copies of the residual stream) the hyper-connection kernels take.
constexpr int kMaxHc = 8;

// One launch for all n tokens: pre/post weights and Sinkhorn(softmax) comb per
// token, then input = sum_h pre[h] * copy h (HcSite::pre's op, ds4_ops.h).
// mixes [n][(2 + hc) * hc] = fn . stream, scaled here by rms_norm's scale of the
// token's stream (rms_eps), base [(2 + hc) * hc], scale [3], stream [n][hc * d].
// With norm, input is then rms_norm(input, rms_eps) * norm->weight (the
// sub-layer's norm, in rms_norm's expressions), in the same launch: the last of
// a token's blocks to finish its chunk scales the row. partials holds
// n * hc_norm_blocks(d) doubles; counters n zeros, left zero again. hc_head
// folds output_norm the same way.
struct HcNorm {
  const float* weight;  // [d]
  double* partials;
  unsigned* counters;
};
int64_t hc_norm_blocks(int64_t d);
cudaError_t hc_pre(const float* mixes, const float* base, const float* scale, const float* stream, int64_t n, int hc,
                   int64_t d, int sinkhorn_iters, float eps, float rms_eps, float* input, float* post, float* comb,
                   const HcNorm* norm, cudaStream_t cs);
// stream copy dst = post[dst] * output + sum_src comb[src][dst] * residual copy src;
// stream may be residual (in place).
cudaError_t hc_post(const float* output, const float* residual, const float* post, const float* comb, int64_t n,
                    int hc, int64_t d, float* stream, cudaStream_t cs);
// out = sum_h (sigmoid(mixes[h] * r * scale[0] + base[h]) + eps) * copy h, r as in
// hc_pre; with norm, through its rms_norm as in hc_pre.
cudaError_t hc_head(const float* mixes, const float* base, const float* scale, const float* stream, int64_t n, int hc,
                    int64_t d, float eps, float rms_eps, float* out, const HcNorm* norm, cudaStream_t cs);

// Blocks first_block .. first_block + n_out - 1; kv and score rows are
// positions rows_first .. (row width = overlap ? 2 * width : width). Every row
// a pooled block reads must be there (the caller checks).
cudaError_t compress_pool(const float* kv, const float* score, int64_t rows_first, int64_t first_block,
                          int64_t n_out, int64_t width, int64_t ratio, bool overlap, float* out, cudaStream_t cs);

// chosen [n][top_k]: per query the visible blocks, ascending, -1 padded (all of
// them when at most top_k are visible, else the top_k of the indexer score by
// score descending, index ascending). scores (n * n_blocks floats) is scratch,
// read only when n_blocks > top_k (else it may be null). In ds4_indexer.cu.
cudaError_t indexer_select(const float* q, const float* w, const float* keys, int64_t n_blocks, int64_t n,
                           int64_t n_head, int64_t head_dim, int64_t pos0, int64_t ratio, int64_t top_k,
                           float* scores, int32_t* chosen, cudaStream_t cs);

struct AttentionArgs {
  const float* q = nullptr;  // [n][n_head * head_dim]
  const float* raw = nullptr;  // [raw_rows][head_dim], positions raw_first ..
  int64_t raw_rows = 0, raw_first = 0, window = 0;
  const float* blocks = nullptr;  // [n_blocks][head_dim] or null
  int64_t n_blocks = 0, ratio = 1;
  const int32_t* chosen = nullptr;  // [n][n_chosen], -1 padded, or null (every visible block)
  int64_t n_chosen = 0;
  const float* sinks = nullptr;  // [n_head]
  int64_t n_head = 0, head_dim = 0, pos0 = 0, n = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [n][n_head * head_dim]
};
// The most keys a query of `a` may see (window + chosen or all blocks), and
// whether their scores fit in shared memory; when not, attention() needs a
// scratch of n * n_head * attention_max_keys(a) floats.
// A launch of few (token, head) pairs (decode) splits each query's keys over
// attention_splits(a) blocks, whose partial softmaxes a second kernel joins:
// then `part` must hold n * n_head * attention_splits(a) * (head_dim + 2)
// floats (may be null when attention_splits(a) is 1).
int64_t attention_max_keys(const AttentionArgs& a);
bool attention_fits_smem(const AttentionArgs& a);
int attention_splits(const AttentionArgs& a);
cudaError_t attention(const AttentionArgs& a, float* scratch, float* part, cudaStream_t cs);
// A prompt's attention as products (the caller's): the keys each query of
// tokens [t0, t0 + m) of `a` sees, in attention()'s order (window, then the
// chosen or visible blocks), copied to keys [m][attention_max_keys(a)][head_dim]
// with zeros after a query's last key, and their number to counts[m] (device).
// attention_gather_fits() says whether the chosen list fits the kernel's shared
// memory (else cudaErrorInvalidValue).
bool attention_gather_fits(const AttentionArgs& a);
cudaError_t attention_gather(const AttentionArgs& a, int64_t t0, int64_t m, float* keys, int32_t* counts,
                             cudaStream_t cs);

}  // namespace xpack::rt::ds4
