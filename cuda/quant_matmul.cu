// Prefill: the tensor-core path of quant_mma.h for the types it takes, otherwise
// tiles of W dequantized exactly (fp32, or bf16 as an explicit option) into a
// workspace and multiplied by cuBLAS; float_gemm, cuBLAS over activations.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <new>

#include "quant_blocks.cuh"
#include "quant_matmul.h"
#include "f32_gemm.h"
#include "quant_mma.h"

namespace xpack::kernels {

namespace dev {

template <uint32_t T, class Out>
__global__ void dequant_kernel(const uint8_t* __restrict__ w, int64_t ne0, size_t rb, int64_t n,
                               Out* __restrict__ out) {
  constexpr int kBe = T == 0 || T == 1 || T == 30 ? 1 : (T == 8 || T == 39 ? 32 : 256);
  constexpr int kBb = T == 0 ? 4 : T == 1 || T == 30 ? 2 : T == 8 ? 34 : T == 39 ? 17
                    : T == 10 ? 84 : T == 11 ? 110 : T == 12 ? 144 : T == 13 ? 176 : 210;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / ne0, i = idx - row * ne0;
    const uint8_t* b = w + size_t(row) * rb + size_t(i / kBe) * kBb;
    const float v = dequant_elem<T>(b, int(i % kBe));
    if constexpr (sizeof(Out) == 4) out[idx] = v;
    else out[idx] = __float2bfloat16_rn(v);
  }
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 132 * 16)); }

template <class Out>
int dequant_launch(uint32_t type, const void* w, int64_t ne0, int64_t n_rows, Out* out, cudaStream_t s) {
  const int64_t n = ne0 * n_rows;
  const size_t rb = row_bytes(type, ne0);
  const auto* p = static_cast<const uint8_t*>(w);
  const unsigned g = grid_for(n);
  switch (type) {
    case kF32: dequant_kernel<0, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kF16: dequant_kernel<1, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kBF16: dequant_kernel<30, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kQ8_0: dequant_kernel<8, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kQ2_K: dequant_kernel<10, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kQ3_K: dequant_kernel<11, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kQ4_K: dequant_kernel<12, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kQ5_K: dequant_kernel<13, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kQ6_K: dequant_kernel<14, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    case kMXFP4: dequant_kernel<39, Out><<<g, 256, 0, s>>>(p, ne0, rb, n, out); break;
    default: return kErrType;
  }
  return cudaGetLastError() == cudaSuccess ? kOk : kErrCuda;
}

}  // namespace dev

namespace {
int check_shape(uint32_t type, int64_t ne0, int64_t ne1) {
  if (block_elems(type) == 0) return kErrType;
  if (ne0 <= 0 || ne1 <= 0 || ne0 % block_elems(type) != 0) return kErrShape;
  if (ne0 > (int64_t(1) << 30) || ne1 > (int64_t(1) << 30)) return kErrShape;
  return kOk;
}
}  // namespace

int dequantize_rows(uint32_t type, const void* w, int64_t ne0, int64_t n_rows, float* out,
                    cudaStream_t stream) {
  if (const int st = check_shape(type, ne0, n_rows); st != kOk) return st;
  if (!w || !out) return kErrArgument;
  return dev::dequant_launch(type, w, ne0, n_rows, out, stream);
}

struct Context {
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  uint32_t* counters = nullptr;  // the split decode kernel's, kept zero between launches
  // cuBLAS's own workspace, given to it with the stream (bind_blas).
  void* blas_workspace = nullptr;
  cudaStream_t blas_stream = nullptr;
  bool blas_bound = false;
};

namespace {
// cublasSetStream drops any workspace the handle was given and falls back to
// cuBLAS's default pool: the stream and a workspace of the context's own are set
// together (as PyTorch does for its handles), and only when the stream changes.
bool bind_blas(Context* c, cudaStream_t stream) {
  if (c->blas_bound && c->blas_stream == stream) return true;
  if (cublasSetStream(c->blas, stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(c->blas, c->blas_workspace, kBlasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS) {
    c->blas_bound = false;
    return false;
  }
  c->blas_stream = stream;
  c->blas_bound = true;
  return true;
}

// The decode kernels' scratch: the workspace (free between products, which run in
// one stream's order) and the counters.
dev::MatvecScratch scratch_of(const Context* c) {
  return dev::MatvecScratch{static_cast<float*>(c->workspace), c->workspace_bytes, c->counters,
                            dev::kMatvecSplitCounters};
}
}  // namespace

int context_create(Context** out, size_t workspace_bytes) {
  if (!out) return kErrArgument;
  *out = nullptr;
  auto* c = new (std::nothrow) Context;
  if (!c) return kErrArgument;
  c->workspace_bytes = workspace_bytes ? workspace_bytes : kDefaultWorkspaceBytes;
  if (cudaMalloc(&c->workspace, c->workspace_bytes) != cudaSuccess) {
    delete c;
    return kErrCuda;
  }
  // Zeroed once here: every split launch leaves its counters zero again. The
  // memset runs on the default stream, which a non-blocking stream does not wait
  // for, hence the synchronization.
  const size_t counter_bytes = dev::kMatvecSplitCounters * sizeof(uint32_t);
  if (cudaMalloc(&c->counters, counter_bytes) != cudaSuccess) {
    cudaFree(c->workspace);
    delete c;
    return kErrCuda;
  }
  if (cudaMemset(c->counters, 0, counter_bytes) != cudaSuccess || cudaStreamSynchronize(nullptr) != cudaSuccess ||
      cudaMalloc(&c->blas_workspace, kBlasWorkspaceBytes) != cudaSuccess) {
    cudaFree(c->blas_workspace);
    cudaFree(c->counters);
    cudaFree(c->workspace);
    delete c;
    return kErrCuda;
  }
  // CUBLAS_DEFAULT_MATH: SGEMM in plain fp32 (TF32 only with *_TF32_TENSOR_OP_MATH).
  if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_workspace);
    cudaFree(c->counters);
    cudaFree(c->workspace);
    delete c;
    return kErrCublas;
  }
  // cuBLAS initialises itself on its first product (about 0.1 s on an H200): do
  // it here, at load, rather than inside the first prompt's prefill, so that the
  // prefill's time is the prefill's (llama.cpp's warm-up run does the same).
  // The operands are the fresh workspace's bytes; the result is discarded.
  {
    const float one = 1.0f, zero = 0.0f;
    auto* ws = static_cast<float*>(c->workspace);
    constexpr int kM = 64, kN = 16, kK = 64;
    const bool ran = c->workspace_bytes >= sizeof(float) * (kM * kK + kK * kN + kM * kN) &&
                     cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, kM, kN, kK, &one, ws, kK, ws + kM * kK, kK,
                                 &zero, ws + kM * kK + kK * kN, kM) == CUBLAS_STATUS_SUCCESS;
    if (ran && cudaStreamSynchronize(nullptr) != cudaSuccess) {
      context_destroy(c);
      return kErrCuda;
    }
  }
  *out = c;
  return kOk;
}

int context_reserve(Context* ctx, size_t workspace_bytes) {
  if (!ctx) return kErrArgument;
  if (workspace_bytes <= ctx->workspace_bytes) return kOk;
  void* grown = nullptr;
  if (cudaMalloc(&grown, workspace_bytes) != cudaSuccess) return kErrCuda;
  cudaFree(ctx->workspace);
  ctx->workspace = grown;
  ctx->workspace_bytes = workspace_bytes;
  return kOk;
}

size_t context_workspace_bytes(const Context* ctx) { return ctx ? ctx->workspace_bytes : 0; }

void context_destroy(Context* ctx) {
  if (!ctx) return;
  cublasDestroy(ctx->blas);
  cudaFree(ctx->blas_workspace);
  cudaFree(ctx->counters);
  cudaFree(ctx->workspace);
  delete ctx;
}

namespace {

struct Opts {
  int precision = kPrecisionFp32;
  int mv_max = 0;  // 0: the type's default (mv_default)
  bool tiles = false;
};

int read_opts(const MatmulOptions* o, Opts* out) {
  *out = Opts{};
  if (!o) return kOk;
  if (o->size != 0 && o->size < sizeof(size_t)) return kErrArgument;
  const size_t n = o->size == 0 ? sizeof(MatmulOptions) : o->size;
  if (n >= offsetof(MatmulOptions, precision) + sizeof(int)) {
    if (o->precision != kPrecisionFp32 && o->precision != kPrecisionBf16) return kErrArgument;
    out->precision = o->precision;
  }
  if (n >= offsetof(MatmulOptions, matvec_max_tokens) + sizeof(int)) {
    if (o->matvec_max_tokens < 0 || o->matvec_max_tokens > kMaxMatvecTokens) return kErrArgument;
    if (o->matvec_max_tokens != 0) out->mv_max = o->matvec_max_tokens;
  }
  if (n >= offsetof(MatmulOptions, fp32_tiles) + sizeof(int)) {
    if (o->fp32_tiles != 0 && o->fp32_tiles != 1) return kErrArgument;
    out->tiles = o->fp32_tiles == 1;
  }
  return kOk;
}

// Where the decode kernel stops paying, for the types with a tensor-core path. The
// choice is the problem's own (a grouped launch equals its problems alone), and the
// two uses pull apart (H100, 2026-12-06, bench-kernels --tokens 2,3,4,8, graphs
// replayed; doc/kernels.md): a product alone gives the tensor-core tiles a grid too
// few for the GPU, and the decode kernel was 2.7-6x faster at 2 to 8 tokens on every
// shape; a prompt's 64-128 experts fill it, and there the decode kernel was
// 0.99-1.49x the tiles at 4 tokens but 0.53-0.69x at 8. Four tokens keeps both uses
// at their faster path or within 1 %: MXFP4's (Q8_0 keeps it too; no Q8_0 experts were
// measured). Q2_K and Q3_K have since got
// a tensor-core decode (kquant_mmv.cu), and on an H100 (2026-12-07, bench-kernels
// --quick --graph --tokens 8 --shape kimi-expert-*) it took their prompt experts at
// 5-8 tokens as well: Kimi-K3's Q2_K gate/up 1.51-1.63x the tiles, its Q3_K down
// 0.97-1.01x; alone, 5.5-6.5x. So they stay on it to its 8 tokens.
int mv_default(uint32_t type) { return type == kMXFP4 || type == kQ8_0 ? 4 : kMaxMatvecTokens; }

// Whatever the precision: decode is bound by the weights' bytes, so rounding x
// to bf16 would only lose digits there.
bool uses_matvec(uint32_t type, const Opts& o, int n_tokens) {
  return n_tokens <= (o.mv_max ? o.mv_max : mv_default(type));
}

// The fp32 default on the tensor cores (quant_mma.h) where the type allows it;
// its 16-byte loads need x and w 16-byte aligned (a sub-view may not be), and
// the workspace must hold one row's split activations.
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
bool uses_mma(const Context* ctx, uint32_t type, int64_t ne0, const Opts& o, const float* x, const void* w) {
  return o.precision == kPrecisionFp32 && !o.tiles && dev::mma_supports(type) && aligned16(x) && aligned16(w) &&
         dev::mma_split_rows(type, ne0, ctx->workspace_bytes) > 0;
}

// mma_grouped() with the context's workspace for the split activations.
int mma(Context* ctx, uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* ps, int n, const float* x,
        float* y, cudaStream_t stream) {
  return dev::mma_grouped(type, ne0, ne1, ps, n, x, y, ctx->workspace, ctx->workspace_bytes, stream);
}

int gemm(Context* ctx, uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x,
         int n_tokens, float* y, const Opts& o, cudaStream_t stream) {
  const bool bf16 = o.precision == kPrecisionBf16;
  if (type == kF32 && !bf16 && !o.tiles) {
    // Already fp32 rows: read in place by the fp32 kernel (f32_gemm.h says why not cuBLAS).
    return dev::f32_gemm(static_cast<const float*>(w), ne0, ne1, x, n_tokens, y, static_cast<float*>(ctx->workspace),
                         ctx->workspace_bytes, stream);
  }
  const size_t elt = bf16 ? 2 : 4;
  const size_t half = ctx->workspace_bytes / 2;
  if (bf16 && n_tokens > 1 && size_t(n_tokens) * size_t(ne0) * 2 + 255 > half && half >= size_t(ne0) * 2 + 255) {
    // x in bf16 would take more than half the workspace (a long prompt): the
    // tokens in parts of at least one, each with its own tiles, so that the
    // tiles keep rows. (A workspace without room for one token's x in half of
    // it is refused below.) part < n_tokens, so it fits an int.
    const int part = int((half - 255) / (size_t(ne0) * 2));
    for (int t0 = 0; t0 < n_tokens; t0 += part) {
      const int n = std::min(part, n_tokens - t0);
      if (const int st = gemm(ctx, type, w, ne0, ne1, x + size_t(t0) * size_t(ne0), n, y + size_t(t0) * size_t(ne1), o,
                              stream);
          st != kOk)
        return st;
    }
    return kOk;
  }
  const size_t x_bytes = bf16 ? ((size_t(n_tokens) * size_t(ne0) * 2 + 255) & ~size_t(255)) : 0;
  if (ctx->workspace_bytes < x_bytes + size_t(ne0) * elt) return kErrWorkspace;
  const int64_t tile = std::min<int64_t>(ne1, int64_t((ctx->workspace_bytes - x_bytes) / (size_t(ne0) * elt)));
  if (!bind_blas(ctx, stream)) return kErrCublas;
  auto* ws = static_cast<uint8_t*>(ctx->workspace);
  const void* xb = x;
  if (bf16) {
    const int64_t n = int64_t(n_tokens) * ne0;
    dev::to_bf16_kernel<<<dev::grid_for(n), 256, 0, stream>>>(x, n, reinterpret_cast<__nv_bfloat16*>(ws));
    if (cudaGetLastError() != cudaSuccess) return kErrCuda;
    xb = ws;
  }
  void* tbuf = ws + x_bytes;
  const float one = 1.0f, zero = 0.0f;
  const size_t rb = row_bytes(type, ne0);
  for (int64_t r0 = 0; r0 < ne1; r0 += tile) {
    const int64_t rows = std::min(tile, ne1 - r0);
    const void* wr = static_cast<const uint8_t*>(w) + size_t(r0) * rb;
    int st;
    if (bf16) st = dev::dequant_launch(type, wr, ne0, rows, static_cast<__nv_bfloat16*>(tbuf), stream);
    else st = dev::dequant_launch(type, wr, ne0, rows, static_cast<float*>(tbuf), stream);
    if (st != kOk) return st;
    // Column-major view: Y'(ne1 x n) = W'^T (rows x ne0) * X' (ne0 x n).
    cublasStatus_t bs;
    if (bf16) {
      bs = cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), n_tokens, int(ne0), &one, tbuf,
                        CUDA_R_16BF, int(ne0), xb, CUDA_R_16BF, int(ne0), &zero, y + r0, CUDA_R_32F,
                        int(ne1), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
      bs = cublasSgemm(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), n_tokens, int(ne0), &one,
                       static_cast<const float*>(tbuf), int(ne0), x, int(ne0), &zero, y + r0, int(ne1));
    }
    if (bs != CUBLAS_STATUS_SUCCESS) return kErrCublas;
  }
  return kOk;
}

}  // namespace

int matmul(Context* ctx, uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x,
           int n_tokens, float* y, const MatmulOptions* opts, cudaStream_t stream) {
  if (const int st = check_shape(type, ne0, ne1); st != kOk) return st;
  Opts o;
  if (const int st = read_opts(opts, &o); st != kOk) return st;
  if (!ctx || !w || !x || !y || n_tokens < 1) return kErrArgument;
  if (uses_matvec(type, o, n_tokens)) {
    const dev::MatvecScratch sc = scratch_of(ctx);
    const ExpertProblem p{w, 0, n_tokens};
    return dev::grouped_matvec_scratch(&sc, type, ne0, ne1, &p, 1, x, y, n_tokens, stream);
  }
  if (uses_mma(ctx, type, ne0, o, x, w)) {
    const ExpertProblem p{w, 0, n_tokens};
    return mma(ctx, type, ne0, ne1, &p, 1, x, y, stream);
  }
  return gemm(ctx, type, w, ne0, ne1, x, n_tokens, y, o, stream);
}

int grouped_matmul(Context* ctx, uint32_t type, int64_t ne0, int64_t ne1,
                   const ExpertProblem* problems, int n_problems, const float* x, float* y,
                   int64_t n_rows, const MatmulOptions* opts, cudaStream_t stream) {
  if (const int st = check_shape(type, ne0, ne1); st != kOk) return st;
  Opts o;
  if (const int st = read_opts(opts, &o); st != kOk) return st;
  if (!ctx || !problems || n_problems <= 0 || !x || !y || n_rows <= 0) return kErrArgument;
  for (int i = 0; i < n_problems; ++i) {
    const ExpertProblem& p = problems[i];
    if (!p.w || p.n_tokens < 1 || p.row < 0 || int64_t(p.row) + p.n_tokens > n_rows) return kErrArgument;
  }
  // Decode-sized problems in grouped_matvec launches, the others in tensor-core
  // launches where the type has them (128 problems per launch at most).
  ExpertProblem small[kMaxGroupedProblems], big[kMaxGroupedProblems];
  int n_small = 0, n_big = 0;
  const dev::MatvecScratch sc = scratch_of(ctx);
  for (int i = 0; i < n_problems; ++i) {
    const ExpertProblem& p = problems[i];
    if (uses_matvec(type, o, p.n_tokens)) {
      small[n_small++] = p;
      if (n_small == kMaxGroupedProblems) {
        if (const int st = dev::grouped_matvec_scratch(&sc, type, ne0, ne1, small, n_small, x, y, n_rows, stream);
            st != kOk)
          return st;
        n_small = 0;
      }
    } else if (uses_mma(ctx, type, ne0, o, x, p.w)) {
      big[n_big++] = p;
      if (n_big == kMaxGroupedProblems) {
        if (const int st = mma(ctx, type, ne0, ne1, big, n_big, x, y, stream); st != kOk) return st;
        n_big = 0;
      }
    } else {
      const int st = gemm(ctx, type, p.w, ne0, ne1, x + size_t(p.row) * size_t(ne0), p.n_tokens,
                          y + size_t(p.row) * size_t(ne1), o, stream);
      if (st != kOk) return st;
    }
  }
  if (n_big > 0)
    if (const int st = mma(ctx, type, ne0, ne1, big, n_big, x, y, stream); st != kOk) return st;
  if (n_small > 0) return dev::grouped_matvec_scratch(&sc, type, ne0, ne1, small, n_small, x, y, n_rows, stream);
  return kOk;
}

int shared_input_matmul(Context* ctx, uint32_t type, int64_t ne0, const SharedInputProduct* products,
                        int n, const float* x, int n_tokens, const MatmulOptions* opts, cudaStream_t stream) {
  Opts o;
  if (const int st = read_opts(opts, &o); st != kOk) return st;
  if (!ctx || !products || n <= 0 || n > kMaxSharedInputProducts || !x || n_tokens < 1) return kErrArgument;
  for (int i = 0; i < n; ++i) {
    if (const int st = check_shape(type, ne0, products[i].ne1); st != kOk) return st;
    if (!products[i].w || !products[i].y) return kErrArgument;
  }
  // One launch for the products matmul() would give to the unsplit decode kernel
  // (for the float types: on its vector path, which their own calls would take).
  const dev::MatvecScratch sc = scratch_of(ctx);
  const bool decode = uses_matvec(type, o, n_tokens);
  const bool is_float = type == kF32 || type == kF16 || type == kBF16;
  SharedInputProduct batch[kMaxSharedInputProducts];
  int n_batch = 0;
  for (int i = 0; i < n; ++i) {
    const SharedInputProduct& p = products[i];
    const bool vec = !is_float || (ne0 % 8 == 0 && aligned16(p.w) && aligned16(x));
    if (decode && vec && !dev::matvec_splits(&sc, type, ne0, p.ne1, n_tokens)) {
      batch[n_batch++] = p;
    } else if (const int st = matmul(ctx, type, p.w, ne0, p.ne1, x, n_tokens, p.y, opts, stream); st != kOk) {
      return st;
    }
  }
  if (n_batch == 1) return matmul(ctx, type, batch[0].w, ne0, batch[0].ne1, x, n_tokens, batch[0].y, opts, stream);
  if (n_batch > 1) return dev::shared_input_matvec(type, ne0, batch, n_batch, x, n_tokens, stream, &sc);
  return kOk;
}

int float_gemm(Context* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
               float beta, float* c, int64_t ldc, int64_t stride_c, int batch, cudaStream_t stream) {
  if (!ctx || !a || !b || !c) return kErrArgument;
  if (m < 0 || n < 0 || k <= 0 || batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0) return kErrArgument;
  if (m == 0 || n == 0 || batch == 0) return kOk;
  const auto fits = [](int64_t v) { return v <= INT_MAX; };
  if (!fits(m) || !fits(n) || !fits(k) || !fits(lda) || !fits(ldb) || !fits(ldc)) return kErrArgument;
  if (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n) || ldc < n) return kErrArgument;
  if (!bind_blas(ctx, stream)) return kErrCublas;
  // cuBLAS is column-major: a row-major X is its column-major X^T, so the
  // product is computed as C^T = op(B)^T op(A)^T, the operands swapped.
  const cublasStatus_t bs = cublasSgemmStridedBatched(
      ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k),
      &alpha, b, int(ldb), stride_b, a, int(lda), stride_a, &beta, c, int(ldc), stride_c, batch);
  return bs == CUBLAS_STATUS_SUCCESS ? kOk : kErrCublas;
}

}  // namespace xpack::kernels
