// GPU matrix products over GGUF-quantized weights, as stored (no dequantized
// copies kept), for the runtime's CUDA backend. Plain C++ over the CUDA runtime
// API: include it from any C++ file; the kernels live in the .cu files beside it.
//
// Layout (ggml's): W has ne0 inputs (contiguous, a whole number of blocks) and
// ne1 output rows, stored row after row in the type's block format;
//   y[t][o] = sum_i W[o][i] * x[t][i],  x fp32 [n_tokens][ne0], y fp32 [n_tokens][ne1].
// Activations are fp32 and every sum is accumulated in fp32 (doc/kernels.md has
// the precision of each path and the measured speeds).
//
// Every function enqueues work on `stream` and returns without waiting for the
// device; none synchronizes the host. A return of kOk means the work was
// enqueued; errors of the launch itself are reported as kErrCuda (the CUDA error
// stays readable through cudaGetLastError()'s sticky state only for sticky
// errors). No exception leaves these functions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace xpack::kernels {

enum Status : int {
  kOk = 0,
  kErrType = -1,       // weight type not supported by these kernels
  kErrShape = -2,      // ne0/ne1 <= 0, ne0 not a whole number of blocks, sizes too large
  kErrArgument = -3,   // null pointer, n_tokens out of range, bad option or problem list
  kErrAlignment = -4,  // w, x not 16-byte aligned (y: 4-byte)
  kErrCuda = -5,       // a CUDA call or launch failed
  kErrCublas = -6,     // cuBLAS refused or failed
  kErrWorkspace = -7,  // the context's workspace cannot hold one dequantized row
};

// A short name for a status ("ok", "unsupported type", ...); never null.
// Thread safety: safe from any thread.
const char* status_name(int status);

// ggml's short name of a supported weight type ("q2_K", "mxfp4", ...), "?" otherwise.
// Thread safety: safe from any thread.
const char* type_name(uint32_t type);

// ggml type ids (the same values as xpack.h's XPACK_TYPE_*).
enum WeightType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
  kMXFP4 = 39,
};

// Elements and bytes of one block of `type`; 0 when these kernels do not support it.
// Thread safety: safe from any thread.
int block_elems(uint32_t type);
int block_bytes(uint32_t type);

// Bytes of one row of ne0 elements; 0 when unsupported or ne0 is not a positive
// whole number of blocks. Thread safety: safe from any thread.
size_t row_bytes(uint32_t type, int64_t ne0);

// Most tokens the matrix-vector kernels take in one launch (decode).
constexpr int kMaxMatvecTokens = 8;

// Decode: y = W x for 1..8 tokens; every weight is read once for all tokens.
// w and x must be 16-byte aligned, y 4-byte aligned; x and y must not overlap.
// Thread safety: safe from any thread (it only enqueues on `stream`).
int matvec(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x, int n_tokens,
           float* y, cudaStream_t stream);

// One expert's share of a grouped product: weights `w` (ne0 x ne1 of the
// launch's type) applied to rows [row, row + n_tokens) of the packed input X
// [n_rows][ne0], written to the same rows of the packed output Y [n_rows][ne1].
// The rows of different problems must not overlap.
struct ExpertProblem {
  const void* w;
  int32_t row;
  int32_t n_tokens;
};

// Most problems one grouped launch takes (Kimi-K3's top-16 for 8 tokens).
constexpr int kMaxGroupedProblems = 128;

// Decode over several experts of one layer in ONE kernel launch: every problem
// has 1..8 tokens, `problems` is a HOST array of n_problems (<= 128; it travels
// as the kernel's parameter, so no device copy of it is needed). Each output row
// is bit-identical to matvec() of its problem alone.
// Thread safety: safe from any thread.
int grouped_matvec(uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* problems,
                   int n_problems, const float* x, float* y, int64_t n_rows, cudaStream_t stream);

// One of several products of the same input x (shared_input_matmul): W (ne0 x ne1
// of the call's type) applied to x, written to y [n_tokens][ne1].
struct SharedInputProduct {
  const void* w;
  int64_t ne1;
  float* y;
};

// Most products one shared_input_matmul call takes (DeepSeek-V4's attention
// reads its layer input with 7, Kimi-K3's KDA with 6).
constexpr int kMaxSharedInputProducts = 16;

// ---- internal: the decode kernels with a context's scratch (quant_matmul.cu) ----
namespace dev {

// Device memory the decode kernels may split a few-row matrix's rows with (each
// row's inputs cut into chunks summed by separate warps, the chunk sums added in
// a fixed order; doc/kernels.md, "Few rows"): `partial` for the chunk sums, and
// `counters`, zero before every launch and left zero by it. A Context owns one.
struct MatvecScratch {
  float* partial;
  size_t partial_bytes;
  uint32_t* counters;
  size_t n_counters;
};

// Matrices of more rows are never split, which bounds the counters: one per
// (problem, group of >= 2 rows).
constexpr int kMatvecSplitMaxRows = 2048;
constexpr size_t kMatvecSplitCounters = size_t(kMaxGroupedProblems) * (kMatvecSplitMaxRows / 2);

// grouped_matvec(), splitting rows where the shape has too few of them to fill
// the GPU and `scratch` (may be null: never) holds one problem's chunk sums. The
// split depends on (type, ne0, ne1, the device, the scratch's size) only, and for
// F32 on whether the problem has one token (its unit, set_f32_variant), so each
// output row still equals this call on its problem alone, bit for bit; it differs
// from the unsplit grouped_matvec() in rounding only. Thread safety: one thread
// and one stream at a time per scratch.
int grouped_matvec_scratch(const MatvecScratch* scratch, uint32_t type, int64_t ne0, int64_t ne1,
                           const ExpertProblem* problems, int n_problems, const float* x, float* y,
                           int64_t n_rows, cudaStream_t stream);

// Whether grouped_matvec_scratch() would split the rows of a (type, ne0, ne1)
// matrix of n_tokens tokens with this scratch (for the float types: on their
// 16-byte vector path, w and x 16-byte aligned and ne0 % 8 == 0). Thread safety:
// safe from any thread.
bool matvec_splits(const MatvecScratch* scratch, uint32_t type, int64_t ne0, int64_t ne1, int n_tokens);

// The unsplit decode kernel over products of one x (x rows [0, n_tokens)) in ONE
// launch, each product in its own rows of the grid; each output equals
// grouped_matvec() of its product alone, bit for bit. `products` is a host
// array of 1..kMaxSharedInputProducts; no y may overlap x or another y. `scratch`
// (may be null) holds the dp4a units' terms of x where it has room (the same bits).
// Thread safety: safe from any thread; one thread and one stream at a time per scratch.
int shared_input_matvec(uint32_t type, int64_t ne0, const SharedInputProduct* products, int n,
                        const float* x, int n_tokens, cudaStream_t stream,
                        const MatvecScratch* scratch = nullptr);

// The decode kernel's layout: where x is staged in shared memory, threads per block
// (256 or 512; any other value, the default: chosen per launch from the occupancy of
// each) and whether a launch's problems share one wave of blocks (the default; else
// each problem gets a wave), neither of which changes any result, bit for bit; and at
// most how many threads share a group of rows (32, 64 or 128: as many as the row has
// units up to that; 128 is the layout before 2026-12-03; 256: a row of 256 units or more
// takes a whole block of 256 threads; any other value, the default: a rule measured
// per type and row length), which changes the order of each row's
// sum (within the same bound); and whether MXFP4's rows load each unit while the
// one before is computed (the default) or each unit just before its products
// (the layout before 2026-12-03; the same bits); and where MXFP4 decode runs on the
// int8 tensor cores instead of the FMA kernel (mxfp4_mmv.cu: other bits within the
// same bound): kMmaDecodeAuto (the default, and any other value: the problems it
// was measured faster on, a rule of the shape and token count, doc/kernels.md),
// kMmaDecodeAlways (every matrix of whole 512-input groups) or kMmaDecodeNever;
// and that kernel's layout: mma_warps warps share a tile of 16 rows (4, 8 or 16) and
// mma_tiles tiles a block of threads (2 or 4; 8 warps take 2, 16 take 1), which
// orders its sums (within the same bound); any other values, the default: each
// problem's by its shape and token count (4 x 4, or 16 x 1 from two tokens on where
// 4 x 4 would leave the GPU's rounds of tiles less than 80 % full);
// and whether K-quant and MXFP4 rows short enough for a token's x to be staged as
// int8 terms take the dp4a units (TQ2_K8 ... TQ6_K8, TMXFP4_8 in matvec_units.cuh,
// MXFP4's where the tensor cores do not take the matrix: other bits
// within the same bound; the default) or the FMA ones; and whether a dp4a or
// tensor-core MXFP4 launch with a context's scratch makes x's terms once for all
// its blocks: kPrestageAuto (the default: dp4a where that was measured faster, the
// tensor cores from two tokens on), kPrestageAlways or kPrestageNever (each block
// its own); the same bytes, so the same bits; and whether the tensor-core MXFP4
// decode from two tokens on takes one int8 product a block and pair of tokens (the
// default) or two, as at one token (the same bits).
// A switch for bench-kernels' side-by-side runs and the tests.
// Thread safety: safe from any thread; launches already enqueued keep theirs.
// A switch with a rule (the default), forced on, or forced off: set_q3k_wide_loads
// and set_mma_slices.
enum : int { kSwitchAuto = 0, kSwitchOn = 1, kSwitchOff = 2 };
enum : int { kMmaDecodeAuto = 0, kMmaDecodeAlways = 1, kMmaDecodeNever = 2 };
enum : int { kPrestageNever = 0, kPrestageAuto = 1, kPrestageAlways = 2 };
void set_matvec_geometry(int block_threads, bool shared_wave, int row_threads = 0, bool pipeline = true,
                         int mma_decode = kMmaDecodeAuto, int mma_warps = 0, int mma_tiles = 0,
                         bool dp4a = true, int prestage = kPrestageAuto, bool mma_one_product = true);

// F32 decode's unit (matvec_units.cuh, TF32V) for every problem: 0, 8 floats and
// two plain loads a row; 1, the same through the read-only path (0's bits); 2, 4
// floats and one load a row (other bits, within the same bound); any other value,
// the default: 2 for a problem of one token, 0 for more (quant_matvec.cu,
// f32_unit). For bench-kernels' side-by-side runs and the tests.
// Thread safety: safe from any thread; launches already enqueued keep theirs.
void set_f32_variant(int variant);

// Whether the decode kernel's groups of rows of more than one warp wait on a named
// barrier of their own between the rounds of their shared-memory sum (on), or on
// the whole block's (off, the default): the same sums in the same order, so the
// same bits. For bench-kernels' side-by-side runs and the tests.
// Thread safety: safe from any thread; launches already enqueued keep theirs.
void set_group_barrier(bool on);

// Whether Q3_K's dp4a decode loads each half block's high bits and quants as 16-byte
// windows (quant_blocks.cuh, ldwords16) or as 4-byte words: the same words, so the
// same bits. kSwitchAuto (the default, and any other value): 16-byte windows where
// they were measured faster (matrices larger than the L2, and a lone product at one
// token; doc/kernels.md); kSwitchOn: always; kSwitchOff: never. For bench-kernels'
// side-by-side runs and the tests.
// Thread safety: safe from any thread; launches already enqueued keep theirs.
void set_q3k_wide_loads(int mode);

// Whether the MXFP4 tensor-core decode (mxfp4_mmv.cu) of layouts of 16 warps a block
// of threads may run sliced: each block one k-split of 16 tiles, staging a quarter
// (4 x 4) or a sixteenth (16 x 1) of x, its warps' sums added after by a second
// launch in the unsliced block's order, so the same bits. kSwitchAuto (the
// default, and any other value): from two tokens on, for rows of 7168 inputs and more
// or launches of several problems; kSwitchOn: at any token count; kSwitchOff: never;
// either only where x may be made once (not kPrestageNever) and a context's scratch
// holds it and the warps' sums. For bench-kernels' side-by-side runs and the tests.
// Thread safety: safe from any thread; launches already enqueued keep theirs.
void set_mma_slices(int mode);

// Where Q2_K and Q3_K decode with a context's scratch (matmul and its grouped and
// shared-input forms) runs on the int8 tensor cores (kquant_mmv.cu; other bits
// within the same bound): kMmaDecodeAuto (the default, and any other value: from
// four tokens on, and from two where the matrix fits the L2, each problem of a
// grouped launch by its own token count; measured fastest, doc/kernels.md),
// kMmaDecodeAlways, or kMmaDecodeNever (the dp4a units). For bench-kernels'
// side-by-side runs and the tests.
// Thread safety: safe from any thread; launches already enqueued keep theirs.
void set_kq_mma(int mode);

// kquant_mmv.cu alone: y = W x for n_tokens (1..8) tokens of Q2_K or Q3_K rows (ne0
// a multiple of 256) on the int8 tensor cores, x staged in scratch
// (kq_mmv_scratch_bytes, 16-byte aligned), whatever set_kq_mma says: for the tests and
// bench-kernels. Thread safety: as matvec().
size_t kq_mmv_scratch_bytes(int64_t ne0, int n_tokens);
// How many warps at most split a tile's row in kq_mmv (1..16; 0 or less: 16, the
// default): the order of its sums, so the bits may change with it. For
// bench-kernels' side-by-side runs. Thread safety: as set_q3k_wide_loads().
void set_kq_mmv_split(int max_warps);
int kq_mmv(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x, int n_tokens, float* y,
           void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace dev

// Dequantizes n_rows rows of W into fp32 out [n_rows][ne0], bit-identical to
// ggml's CPU decoders (examples/xpack-run/dequant.cpp). Used by matmul's tiles.
// Thread safety: safe from any thread.
int dequantize_rows(uint32_t type, const void* w, int64_t ne0, int64_t n_rows, float* out,
                    cudaStream_t stream);

// ---- prefill: matrix-matrix -------------------------------------------------

enum Precision : int {
  // Weights dequantized exactly to fp32 tiles, cuBLAS SGEMM with TF32 off.
  kPrecisionFp32 = 0,
  // Beyond matvec_max_tokens (decode-sized products stay on the fp32 matvec):
  // weights and x rounded to bf16, cuBLAS on the tensor cores, fp32 accumulation;
  // per product a relative error up to 2^-8, so |y - exact| <= 4e-3 * sum|w*x| (tested).
  kPrecisionBf16 = 1,
};

struct MatmulOptions {
  size_t size;          // sizeof(MatmulOptions); a zero-filled struct means the defaults
  int precision;        // Precision; 0 = kPrecisionFp32
  int matvec_max_tokens;  // up to this many tokens use matvec (in fp32, whatever precision says); 0 = 4 for
                          // MXFP4 and Q8_0 (their tensor-core tiles win on a prompt's experts), 8 otherwise
  int fp32_tiles;       // 1: fp32 products beyond matvec always take the dequantized-tile +
                        // SGEMM path (the baseline the tensor-core path is measured against)
};

// Owns a cuBLAS handle and a device workspace for the dequantized tiles, the
// tensor-core products' split activations (6 bytes an input: a workspace of
// fewer rows than a prompt takes it in parts) and the decode kernels' partial
// sums where they split rows (with 512 KiB of counters beside it), and 32 MiB
// that cuBLAS gets as its own workspace.
struct Context;

// The workspace context_create gives for 0, and cuBLAS's own beside it (NVIDIA's
// guidance for sm_90: 32 MiB).
constexpr size_t kDefaultWorkspaceBytes = size_t(64) << 20;
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

// workspace_bytes: 0 = kDefaultWorkspaceBytes. Allocates with cudaMalloc (once, here); waits
// for the zeroed counters (and cuBLAS's warm-up) before returning.
// Thread safety: safe from any thread; the new context belongs to its caller.
int context_create(Context** out, size_t workspace_bytes);
// Grows the workspace to at least workspace_bytes (a size it already has keeps
// it): for a caller that learns its largest product only after creating the
// context (xpack-run, once the model is loaded). The new workspace is allocated
// before the old one is freed, so on failure (kErrCuda) the old one is kept.
// Waits for the device (cudaFree does). kErrArgument for a null context.
// Thread safety: not with other calls on the same context, nor while products
// enqueued with it are still to run.
int context_reserve(Context* ctx, size_t workspace_bytes);
// The workspace's bytes now (not counting cuBLAS's kBlasWorkspaceBytes).
// Thread safety: not with context_reserve on the same context.
size_t context_workspace_bytes(const Context* ctx);
// Waits for nothing: the caller must have finished (or ordered before a
// cudaFree-safe point) every product enqueued with it. destroy(nullptr) is a no-op.
// Thread safety: not with other calls on the same context.
void context_destroy(Context* ctx);

// y = W x for any n_tokens >= 1: up to opts->matvec_max_tokens tokens in fp32
// through matvec()'s kernel (a matrix with too few rows to fill the GPU has its
// rows split over more warps, the workspace holding the partial sums: the same
// bits run after run, within the same bound; doc/kernels.md, "Few rows"); more,
// for MXFP4, Q8_0, Q3_K and Q2_K with w and x 16-byte aligned and a workspace
// that holds one row's split activations, through tensor cores within the fp32
// bound (quant_mma.h says why that holds);
// otherwise tiles of W dequantized into the workspace and multiplied by cuBLAS.
// opts may be null (defaults).
// Thread safety: one thread at a time per context, and every call with one
// context on ONE stream (the workspace is reused in that stream's order).
int matmul(Context* ctx, uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x,
           int n_tokens, float* y, const MatmulOptions* opts, cudaStream_t stream);

// Several experts of one layer: problems with at most matvec_max_tokens tokens
// (fp32) go through ONE grouped_matvec launch (in chunks of 128; rows split as
// in matmul(), in more launches where the workspace holds fewer problems'
// partial sums), the others through one tensor-core launch (MXFP4, Q8_0, Q3_K,
// Q2_K; in chunks of 128) or matmul() each. Each output row equals matmul() of
// its problem alone, bit for bit. `problems` is a host array.
// Thread safety: as matmul().
int grouped_matmul(Context* ctx, uint32_t type, int64_t ne0, int64_t ne1,
                   const ExpertProblem* problems, int n_problems, const float* x, float* y,
                   int64_t n_rows, const MatmulOptions* opts, cudaStream_t stream);

// y_i = W_i x for products of one type and input width (the projections a layer
// makes of its normed input): those matmul() would give to the decode kernel
// unsplit go through ONE launch, the others through matmul() each. Each output
// equals matmul() of its product alone, bit for bit. `products` is a host array
// of 1..kMaxSharedInputProducts; no y may overlap x or another y.
// Thread safety: as matmul().
int shared_input_matmul(Context* ctx, uint32_t type, int64_t ne0, const SharedInputProduct* products,
                        int n, const float* x, int n_tokens, const MatmulOptions* opts, cudaStream_t stream);

// Products of fp32 activations with each other (attention's scores and mixes),
// which no weight type describes: ROW-MAJOR strided-batched SGEMM on the
// context's cuBLAS handle (its default math mode: plain fp32, no TF32),
//   C_b = alpha * op(A_b) * op(B_b) + beta * C_b  for b < batch,
// with A_b = a + b * stride_a (likewise B_b, C_b), op(X) = X^T where trans_x;
// op(A_b) is m x k, op(B_b) k x n, C_b m x n. Each matrix is stored row after
// row, its leading dimension the elements from one row to the next: lda >= k
// (>= m with trans_a), ldb >= n (>= k with trans_b), ldc >= n. With beta == 0,
// C is not read (it may hold anything). Strides may be 0 (one matrix for every
// batch); the batches' C must not overlap. m, n or batch == 0: nothing to do.
// kErrArgument: a null pointer, a negative size or stride, k == 0, a size or
// leading dimension over INT_MAX, a leading dimension under its row's width.
// Thread safety: as matmul().
int float_gemm(Context* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
               float beta, float* c, int64_t ldc, int64_t stride_c, int batch, cudaStream_t stream);

// ---- the pieces of a routed-experts dispatcher --------------------------------

// dst[r] = src[rows[r]] for r < n_rows (rows of ne0 floats); rows is a DEVICE array.
// Thread safety: safe from any thread.
int gather_rows(const float* src, int64_t ne0, const int32_t* rows, int64_t n_rows, float* dst,
                cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
// Thread safety: safe from any thread.
int silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);

// DeepSeek-V4's clamped SwiGLU: with limit > 1e-6, g = min(gate, limit),
// u = clamp(up, -limit, limit); out = silu(g) * u (limit <= 1e-6: no clamping).
// Thread safety: safe from any thread.
int clamped_swiglu(const float* gate, const float* up, int64_t n, float limit, float* out,
                   cudaStream_t stream);

// Kimi-K3's situ: beta*tanh(g/beta)*sigmoid(g) * (linear_beta > 0 ?
// linear_beta*tanh(u/linear_beta) : u). Thread safety: safe from any thread.
int situ_mul(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
             float* out, cudaStream_t stream);

// Weighted combine of expert outputs, in a fixed order (deterministic, no atomics):
//   out[t][i] (+)= sum_{j<k} weights[t*k + j] * y[rows[t*k + j]][i]
// for t < n_tokens; rows[] < 0 are skipped. rows and weights are DEVICE arrays;
// accumulate = false overwrites out. Thread safety: safe from any thread.
int combine_rows(const float* y, int64_t ne0, const int32_t* rows, const float* weights,
                 int64_t n_tokens, int k, bool accumulate, float* out, cudaStream_t stream);

}  // namespace xpack::kernels
