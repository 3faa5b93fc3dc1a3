// Decode kernels: y = W x for 1..8 tokens over GGUF blocks as stored, one
// launch for one matrix, for a whole group of experts, or for the products of
// one input (each of its own rows and output: GroupParams::shared).
//
// Shape of the work: a group of `tpr` threads (32, 64 or 128, chosen from the row
// length and the type: row_tpr_log2) owns R consecutive rows; its threads walk the
// rows' "units" (a block, or the part of a block whose quant bytes belong together)
// with stride tpr, so the threads of a warp read neighbouring bytes. Each unit's bytes are loaded into
// registers once and used for all R rows' x and all tokens: x is read once per R
// rows (R = 4 for one token, 2 otherwise) and every weight once per launch
// (each type's unit: matvec_units.cuh). Partial sums are reduced by warp shuffles and, for
// groups of several warps, through shared memory in a fixed order, so results do
// not depend on the launch's other rows or problems.
//
// Matrices with few rows (a split, below matvec_split_kernel): through matmul()'s
// context, whose workspace holds partial sums, each row's units are cut into
// chunks that separate warps sum, and the chunks' sums are added in a fixed order.
#include <cuda_pipeline.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "matvec_launch.cuh"
#include "matvec_units.cuh"
#include "quant_blocks.cuh"
#include "quant_matmul.h"

namespace xpack::kernels {
namespace dev {

// ---- the kernel ----------------------------------------------------------------------

constexpr int kThreads = 256;
// How far the decode kernel's loop over a lane's units is unrolled, meant to put
// several units' loads in flight: the small units (an MXFP4 or Q8_0 block, 17 or
// 34 bytes) take a few registers each; the K-quants' half blocks take 20-27 a
// row and would spill. The compiler still kept each MXFP4 unit's loads next to
// its own arithmetic (SASS, 2026-12-03): kPipelines below loads ahead by hand.
template <class Ty>
constexpr int kUnitsInFlight = Ty::kUnit == 32 ? 4 : 1;
// x staged in shared memory when it fits: the threads of a warp read x at a
// stride of one unit, which from L1 costs one cache-line wavefront per thread
// (the measured bottleneck); in shared memory each unit's x is padded by 4
// floats, so 8 consecutive threads' 16-byte reads hit 8 different bank groups.
constexpr size_t kMaxSmemX = 200 * 1024;

// Types whose units load ahead (Ty::load, Ty::compute): the next unit's bytes
// are requested before this unit's products. The compiler kept each unit's
// loads next to its own arithmetic (SASS of the MXFP4 kernel, 2026-12-03): one
// unit of 68 bytes in flight per thread, then about a thousand instructions
// with none.
template <class Ty>
constexpr bool kPipelines = std::is_same_v<Ty, TMXFP4>;

// Units that read x staged as int8 terms (Ty::stage_chunk), never x itself: only
// the staged kernel takes them, and only where 8 tokens' terms fit (dp4a_takes).
template <class Ty>
constexpr bool kTermsX = std::is_base_of_v<TermsX, Ty>;
// Q3_K's dp4a unit, with either load (TQ3_K8T<kWide>): one rule for both.
template <class Ty>
constexpr bool kQ3K8 = std::is_same_v<Ty, TQ3_K8> || std::is_same_v<Ty, TQ3_K8W>;
// Units whose x the unsplit kernel stages in shared memory where it fits: the
// quantized ones. With 8-element units the float types' x reads were already cheap
// from L1 (f16 at n=1: 77 % of the copy bandwidth from global x, 47 % from shared
// memory, H200 2026-12-01).
template <class Ty>
constexpr bool kStagesX = Ty::kUnit % 4 == 0 && !std::is_same_v<Ty, TF32V<0>> && !std::is_same_v<Ty, TF32V<1>> &&
                          !std::is_same_v<Ty, TF32V<2>> && !std::is_same_v<Ty, THalf<false>> &&
                          !std::is_same_v<Ty, THalf<true>>;
// Staged floats a unit and token.
template <class Ty>
constexpr int staged_floats() {
  if constexpr (kTermsX<Ty>) return Ty::kXs;
  else return Ty::kUnit + 4;
}

// The rounds of a group of rows' shared-memory sum wait for that group's warps
// only (a named barrier, one per group) where group_bar is set, else for the
// whole block (__syncthreads): the same sums in the same order either way.
__device__ __forceinline__ void group_sync(bool group_bar, int grp, int threads) {
  if (group_bar) asm volatile("bar.sync %0, %1;" ::"r"(grp + 1), "r"(threads) : "memory");
  else __syncthreads();
}

template <class Ty, int NT, int R, bool kSmemX, int kBlock = kThreads, bool kPipe = false>
__global__ void __launch_bounds__(kBlock) matvec_kernel(const GroupParams gp, int ne0, int ne1,
                                                          size_t row_bytes, const float* __restrict__ x,
                                                          float* __restrict__ y, int tpr_log2, bool group_bar) {
  extern __shared__ float4 xsm4[];
  constexpr int kU = Ty::kUnit;
  const int p = blockIdx.y;
  const uint8_t* W = gp.w[p];
  const int row0 = gp.row[p];
  const int nt = gp.ntok[p];
  const int tpr = 1 << tpr_log2;
  const int grp = threadIdx.x >> tpr_log2;
  const int lane = threadIdx.x & (tpr - 1);
  const int units = ne0 / kU;

  const float* xp[NT];
  int xs;
  if constexpr (kTermsX<Ty>) {
    static_assert(kSmemX, "the dp4a units read x staged as terms");
    auto* xsm = reinterpret_cast<uint8_t*>(xsm4);
    const size_t token_bytes = size_t(units) * (4 * Ty::kXs);
    if (gp.terms) {
      // The launch's terms, made once (stage_terms_kernel): a copy of the bytes the
      // branch below makes, which each block of a long row had paid for again.
      // Launched as that kernel's programmatic dependent (launch_smem_x), this grid
      // may start before it ends: it waits here until it has, its writes visible.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
      const int pieces = int(token_bytes / 16);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const uint8_t* src = gp.terms + size_t(gp.trow[p] + min(t, nt - 1)) * token_bytes;
        for (int i = threadIdx.x; i < pieces; i += kBlock)
          __pipeline_memcpy_async(xsm + size_t(t) * token_bytes + 16 * size_t(i), src + 16 * size_t(i), 16);
      }
      __pipeline_commit();
      __pipeline_wait_prior(0);
    } else {
      // x's floats first, each unit's to the bytes its terms will take (independent
      // loads, all in flight at once), then a warp turns one (token, 32-input chunk)
      // at a time into terms in place.
      const int quads = ne0 / 4;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* src = reinterpret_cast<const float4*>(x + size_t(row0 + min(t, nt - 1)) * size_t(ne0));
        uint8_t* dst = xsm + size_t(t) * token_bytes;
        for (int i = threadIdx.x; i < quads; i += kBlock) {
          const int e = 4 * i;
          *reinterpret_cast<float4*>(dst + size_t(e / kU) * (4 * Ty::kXs) + 4 * (e % kU)) = __ldg(src + i);
        }
      }
      __syncthreads();
      const int chunks = Ty::kChunks * units;
      for (int item = int(threadIdx.x >> 5); item < NT * chunks; item += kBlock / 32) {
        const int t = item / chunks, c = item - t * chunks;
        Ty::stage_chunk(xsm + size_t(t) * token_bytes + size_t(c / Ty::kChunks) * (4 * Ty::kXs), c % Ty::kChunks);
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) xp[t] = reinterpret_cast<const float*>(xsm + size_t(t) * token_bytes);
    xs = Ty::kXs;
    __syncthreads();
  } else if constexpr (kSmemX) {
    constexpr int kXs = kU + 4;
    float* xsm = reinterpret_cast<float*>(xsm4);
    const int quads = ne0 / 4;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4* src = reinterpret_cast<const float4*>(x + size_t(row0 + min(t, nt - 1)) * size_t(ne0));
      float* dst = xsm + size_t(t) * size_t(units) * kXs;
      for (int i = threadIdx.x; i < quads; i += kBlock) {
        const int e = 4 * i;
        *reinterpret_cast<float4*>(dst + (e / kU) * kXs + e % kU) = __ldg(src + i);
      }
      xp[t] = dst;
    }
    xs = kXs;
    __syncthreads();
  } else {
#pragma unroll
    for (int t = 0; t < NT; ++t) xp[t] = x + size_t(row0 + min(t, nt - 1)) * size_t(ne0);
    xs = kU;
  }

  const int groups = kBlock >> tpr_log2;
  // Products of one input (gp.shared, one problem of blocks): their row groups
  // one after another, so each product gets blocks in proportion to its rows
  // (a grid row per product gave every product the largest one's blocks, most
  // of them idle: Kimi-K3's MLA projections of 512, 1536 and 12288 rows took
  // 100 us for 39 MB, H200 --profile-ops 2026-12-03).
  int row_groups = (ne1 + R - 1) / R;
  if (gp.shared) row_groups = shared_groups(gp, R);
  // Blocks loop over groups of rows, so a grid sized to the machine stages x once per block.
  for (int rg0 = blockIdx.x * groups; rg0 < row_groups; rg0 += gridDim.x * groups) {
    int g = rg0 + grp;
    if (gp.shared) {  // the group's product; a group past the last one's rows is the last's, and skips
      const int q = shared_product(gp, R, g);
      W = gp.w[q];
      ne1 = gp.ne1[q];
      y = gp.y[q];
    }
    const int o0 = g * R;
    const uint8_t* rp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rp[r] = W + size_t(min(o0 + r, ne1 - 1)) * row_bytes;

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

    if constexpr (kPipe) {
      // The unit after this one is loaded (clamped to the row's last: a valid
      // address, loaded and unused at the end) while this one is computed.
      typename Ty::template Raw<R> cur, next;
      Ty::template load<R>(rp, min(lane, units - 1), cur);
#pragma unroll 2
      for (int u = lane; u < units; u += tpr) {
        Ty::template load<R>(rp, min(u + tpr, units - 1), next);
        Ty::template compute<NT, R>(rp, cur, u, xp, acc, xs);
        cur = next;
      }
    } else {
      // Unrolled so that the loads of several units are in flight before their
      // products need them: one unit's HBM latency is many times its arithmetic.
#pragma unroll(kUnitsInFlight<Ty>)
      for (int u = lane; u < units; u += tpr) Ty::template run<NT, R>(rp, u, xp, acc, xs);
    }

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r][t] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][t], off);

    if (tpr > 32) {
      __shared__ float red[kBlock / 32][R][NT];
      const int warp = threadIdx.x >> 5;
      if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int t = 0; t < NT; ++t) red[warp][r][t] = acc[r][t];
      }
      group_sync(group_bar, grp, tpr);
      if (lane == 0) {
        const int nw = tpr >> 5;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            float s = red[warp][r][t];
            for (int i = 1; i < nw; ++i) s += red[warp + i][r][t];
            acc[r][t] = s;
          }
      }
      group_sync(group_bar, grp, tpr);  // red is reused by the next group of rows
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int o = o0 + r;
        if (o >= ne1) continue;
#pragma unroll
        for (int t = 0; t < NT; ++t)
          if (t < nt) y[size_t(row0 + t) * size_t(ne1) + o] = acc[r][t];
      }
    }
  }
}

// x as the dp4a units read it, made once for a launch (GroupParams::terms): each
// warp takes one (token, unit) of its problem after another, copies the unit's
// floats into its own shared memory, turns them into terms by Ty::stage_chunk
// (what matvec_kernel runs where there is no such copy, so both give the same
// bytes) and writes them out. Problems of one input (gp.shared) take one grid row.
template <class Ty>
__global__ void __launch_bounds__(kThreads) stage_terms_kernel(const GroupParams gp, int ne0,
                                                                 const float* __restrict__ x,
                                                                 uint8_t* __restrict__ terms) {
  constexpr int kBytes = 4 * Ty::kXs;
  constexpr int kWarps = kThreads / 32;
  __shared__ __align__(16) uint8_t buf[kWarps][kBytes];
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  // The product may be launched now (its blocks wait for this grid's end before
  // reading the terms): its launch's latency, about 2 us, overlaps this kernel.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int p = blockIdx.y;
  const int units = ne0 / Ty::kUnit;
  const int items = gp.ntok[p] * units;
  uint8_t* b = buf[warp];
  for (int item = int(blockIdx.x) * kWarps + warp; item < items; item += int(gridDim.x) * kWarps) {
    const int t = item / units, u = item - t * units;
    const float4* src = reinterpret_cast<const float4*>(x + size_t(gp.row[p] + t) * size_t(ne0) + size_t(u) * Ty::kUnit);
    for (int i = lane; i < Ty::kUnit / 4; i += 32) reinterpret_cast<float4*>(b)[i] = __ldg(src + i);
    __syncwarp();
#pragma unroll
    for (int c = 0; c < Ty::kChunks; ++c) Ty::stage_chunk(b, c);
    __syncwarp();
    uint4* dst = reinterpret_cast<uint4*>(terms + (size_t(gp.trow[p] + t) * size_t(units) + size_t(u)) * kBytes);
    for (int i = lane; i < kBytes / 16; i += 32) dst[i] = reinterpret_cast<const uint4*>(b)[i];
    __syncwarp();  // the buffer is read out before the next item overwrites it
  }
}

// Threads per row (log2) of the unsplit kernel: as many as the row has units, up to 128.
inline int tpr_log2_for(int units) { return units >= 128 ? 7 : (units >= 64 ? 6 : 5); }

// ---- the split of a row's units over several warps ---------------------------------
//
// The kernel above gives a group of rows to one group of at most 128 threads, so a
// matrix of few rows (DeepSeek-V4's hyper-connection weights: 24 or 4 rows of 16384)
// fills 3 blocks of a 132-SM GPU and runs at launch-plus-latency speed, most of the
// machine idle. Here a warp owns one (row group, chunk of units) item instead; it
// writes its rows' chunk sums to the context's workspace and the warp that finishes
// a row group's last chunk (a per-row-group counter says which) adds the chunks in
// chunk order. Which warp arrives last changes nothing but who adds: the sum is the
// same, bit for bit, run after run. The chunking depends on the type, ne0, ne1,
// the device's SM count and the scratch's size only (never on the token count or
// the launch's other problems), so grouped launches keep equalling separate ones.

// Two warps per block: small blocks spread the few items over more SMs.
constexpr int kSplitThreads = 64;
// At most two chunk sums per lane in the final sum (one load each, no loop).
constexpr int kMaxChunks = 64;
// Enough (row, chunk) pieces for about 8 warps per SM at one token (R = 4).
constexpr int kSplitPiecesPerSm = 32;

struct Split {
  int chunks = 1;       // 1: no split
  int chunk_units = 0;  // a multiple of 32, so every lane of a chunk's warp has work
};

struct SplitArgs {
  float* partial;        // [problem][token][row][chunk] chunk sums
  uint32_t* counters;    // [problem][row group]: zero before and after every launch
  size_t problem_floats;  // NT * ne1 * chunks
  int chunks, chunk_units, row_groups;
};

template <class Ty, int NT, int R>
__global__ void __launch_bounds__(kSplitThreads) matvec_split_kernel(const GroupParams gp, int ne0, int ne1,
                                                                     size_t row_bytes,
                                                                     const float* __restrict__ x,
                                                                     float* __restrict__ y, const SplitArgs sa) {
  constexpr int kU = Ty::kUnit;
  const int p = blockIdx.y;
  const int item = blockIdx.x * (kSplitThreads / 32) + int(threadIdx.x >> 5);
  if (item >= sa.row_groups * sa.chunks) return;  // the whole warp: no shuffle is left half-empty
  const int lane = threadIdx.x & 31;
  const int rg = item / sa.chunks, c = item - rg * sa.chunks;
  const uint8_t* W = gp.w[p];
  const int row0 = gp.row[p];
  const int nt = gp.ntok[p];

  const float* xp[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xp[t] = x + size_t(row0 + min(t, nt - 1)) * size_t(ne0);
  const int o0 = rg * R;
  const uint8_t* rp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rp[r] = W + size_t(min(o0 + r, ne1 - 1)) * row_bytes;

  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  const int u_end = min(ne0 / kU, (c + 1) * sa.chunk_units);
  for (int u = c * sa.chunk_units + lane; u < u_end; u += 32) Ty::template run<NT, R>(rp, u, xp, acc, kU);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][t] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][t], off);

  float* part = sa.partial + size_t(p) * sa.problem_floats;
  uint32_t* cnt = sa.counters + size_t(p) * size_t(sa.row_groups) + size_t(rg);
  int last = 0;
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (o0 + r < ne1 && t < nt) part[(size_t(t) * size_t(ne1) + size_t(o0 + r)) * sa.chunks + c] = acc[r][t];
    // The chunk sums reach L2 before the counter counts them, so the warp that
    // sees the count complete reads every chunk's sum.
    __threadfence();
    last = atomicAdd(cnt, 1u) == unsigned(sa.chunks - 1);
    if (last) __threadfence();  // the reads below come after the completed count
  }
  last = __shfl_sync(0xFFFFFFFFu, last, 0);
  if (!last) return;
  __syncwarp();  // orders lane 0's observation before the other lanes' reads (a shuffle does not)
  // Lane l adds chunks l and l + 32, then the warp's fixed shuffle tree: one order
  // for a given chunk count, whichever warp does it. Loads bypass L1 (__ldcg),
  // which holds nothing of the other SMs' writes.
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int o = o0 + r;
      if (o >= ne1 || t >= nt) continue;  // the same for the whole warp
      const float* q = part + (size_t(t) * size_t(ne1) + size_t(o)) * sa.chunks;
      float s = lane < sa.chunks ? __ldcg(q + lane) : 0.0f;
      if (lane + 32 < sa.chunks) s += __ldcg(q + lane + 32);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);
      if (lane == 0) y[size_t(row0 + t) * size_t(ne1) + o] = s;
    }
  // Every chunk has counted: nothing else touches this counter in this launch,
  // and the next launch on the stream finds it zero again.
  if (lane == 0) atomicExch(cnt, 0u);
}

// The split for a shape: none where the unsplit grid at one token (the smallest,
// R = 4) has at least half as many blocks as the GPU has SMs; otherwise chunks of
// at least 32 units (one per lane), enough of them for kSplitPiecesPerSm (row,
// chunk) pieces per SM. From the type, ne0, ne1 and the device only. The
// 2048-row cap (kMatvecSplitMaxRows, which bounds the counters) costs nothing:
// a row of >= 64 units (needed for 2 chunks) gets >= 64 threads, so 2048 rows
// already make >= 128 blocks.
template <class Ty>
Split split_plan(int ne0, int ne1) {
  const int units = ne0 / Ty::kUnit;
  const int rows_per_block = (kThreads >> tpr_log2_for(units)) * 4;
  const int blocks = (ne1 + rows_per_block - 1) / rows_per_block;
  const int sms = sm_count();
  if (sms <= 0 || ne1 > kMatvecSplitMaxRows || 2 * blocks >= sms) return Split{};
  // Rows of fewer than 256 units already give each lane one or two: the split's
  // round trip made Q2_K, Q3_K and Q6_K at 16384 inputs (128 units) 0.8-1.06x
  // (H200, bench-kernels --few-rows), against 1.25-2x for rows of 256 and more.
  if (units < 256) return Split{};
  const int want = (kSplitPiecesPerSm * sms + ne1 - 1) / ne1;
  const int chunks = std::min({kMaxChunks, units / 32, want});
  if (chunks < 2) return Split{};
  const int per = (units + chunks - 1) / chunks;
  Split sp;
  sp.chunk_units = (per + 31) & ~31;
  sp.chunks = (units + sp.chunk_units - 1) / sp.chunk_units;
  return sp.chunks >= 2 ? sp : Split{};
}

// R of a launch: four rows per group for one token (x reused 4 times), two
// otherwise; Q6_K's larger units keep two (four would halve the resident warps
// for registers), and so do the dp4a units but Q2_K's and MXFP4's (at four rows Q3_K's took
// 169 registers, Q4_K's 156, Q5_K's 196, Q6_K's 219: 8 warps an SM). Results do
// not depend on it: each row's sum is its own.
template <class Ty, int NT>
constexpr int rows_per_group() {
  constexpr bool kTwo =
      std::is_same_v<Ty, TQ6_K> || (kTermsX<Ty> && !std::is_same_v<Ty, TQ2_K8> && !std::is_same_v<Ty, TMXFP4_8>);
  return (NT == 1 && !kTwo) ? 4 : 2;
}

// The split launch, in as many launches as the workspace needs (each holds the
// chunk sums of up to partial_bytes / (NT * ne1 * chunks * 4) problems; the
// caller checked that one problem of 8 tokens fits).
template <class Ty, int NT>
cudaError_t launch_split(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y,
                         const Split& sp, const MatvecScratch& sc, cudaStream_t stream) {
  constexpr int R = rows_per_group<Ty, NT>();
  SplitArgs sa{};
  sa.partial = sc.partial;
  sa.counters = sc.counters;
  sa.chunks = sp.chunks;
  sa.chunk_units = sp.chunk_units;
  sa.row_groups = (ne1 + R - 1) / R;
  sa.problem_floats = size_t(NT) * size_t(ne1) * size_t(sp.chunks);
  const int per_launch = int(std::min<size_t>(size_t(gp.n), sc.partial_bytes / sizeof(float) / sa.problem_floats));
  if (per_launch < 1) return cudaErrorInvalidValue;  // split_fits() rules this out
  const int items = sa.row_groups * sp.chunks;
  const unsigned bx = unsigned((items + kSplitThreads / 32 - 1) / (kSplitThreads / 32));
  GroupParams sub{};
  for (int p0 = 0; p0 < gp.n; p0 += per_launch) {
    sub.n = std::min(per_launch, gp.n - p0);
    for (int i = 0; i < sub.n; ++i) {
      sub.w[i] = gp.w[p0 + i];
      sub.row[i] = gp.row[p0 + i];
      sub.ntok[i] = gp.ntok[p0 + i];
    }
    matvec_split_kernel<Ty, NT, R><<<dim3(bx, unsigned(sub.n)), kSplitThreads, 0, stream>>>(sub, ne0, ne1, rb, x,
                                                                                             y, sa);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// How the staged-x kernel is laid out on the GPU; neither changes a result (each
// row's sum is its own group's). bench-kernels measures them side by side.
std::atomic<int> g_block{0};
std::atomic<bool> g_shared_wave{true};
std::atomic<int> g_row_threads{0};
std::atomic<bool> g_pipeline{true};
std::atomic<int> g_mma_decode{kMmaDecodeAuto};
std::atomic<int> g_mma_layout{int(MmaLayout::kAuto)};
std::atomic<bool> g_dp4a{true};
std::atomic<int> g_prestage{kPrestageAuto};
std::atomic<bool> g_mma_one_product{true};
std::atomic<int> g_f32_variant{-1};  // TF32V's variant (set_f32_variant; -1: f32_unit's rule)
std::atomic<bool> g_group_bar{false};
std::atomic<int> g_q3k_wide{kSwitchAuto};
std::atomic<int> g_kq_mma{kMmaDecodeAuto};  // set_kq_mma
std::atomic<int> g_mma_slices{kSwitchAuto};   // set_mma_slices
struct Geometry {
  int block;         // threads per block: 256, 512, or 0: chosen per launch (launch_smem_x)
  bool shared_wave;  // the problems of a launch share one wave of blocks (else one wave each)
  int row_threads;   // 32, 64, 128: tpr_log2_for's capped at this many threads per row group; 256: rows of
                     // 256 units and more a block's 256 threads (0: row_tpr_log2's rule)
  bool pipeline;     // kPipelines types load a unit ahead (the same bits either way)
  int mma_decode;    // MXFP4 on the int8 tensor cores (mxfp4_mmv.cu): kMmaDecodeAuto/Always/Never
  MmaLayout mma_layout;  // that kernel's warps a tile x tiles a block (orders its sums)
  bool dp4a;             // K-quant and MXFP4 rows that dp4a_takes on the dp4a units (Dp4aUnit)
  int prestage;          // kPrestage*: a dp4a launch's terms made once (stage_terms_kernel; the same bits either way)
  bool mma_one_product;  // mxfp4_mmv.cu from two tokens on: one product a block and pair of tokens (the same bits)
  bool group_bar;        // a group of rows' sum waits on a barrier of its own (group_sync; the same bits)
  int q3k_wide;          // kSwitch*: Q3_K's dp4a unit loads through ldwords16 (TQ3_K8W; the same bits)
  int kq_mma;            // Q2_K and Q3_K on the int8 tensor cores (kquant_mmv.cu): kMmaDecode*
  int mma_slices;        // kSwitch*: mxfp4_mmv.cu's launches may run sliced (the same bits)
};
inline Geometry geometry() {
  return Geometry{g_block.load(std::memory_order_relaxed), g_shared_wave.load(std::memory_order_relaxed),
                  g_row_threads.load(std::memory_order_relaxed), g_pipeline.load(std::memory_order_relaxed),
                  g_mma_decode.load(std::memory_order_relaxed),
                  MmaLayout(g_mma_layout.load(std::memory_order_relaxed)),
                  g_dp4a.load(std::memory_order_relaxed), g_prestage.load(std::memory_order_relaxed),
                  g_mma_one_product.load(std::memory_order_relaxed), g_group_bar.load(std::memory_order_relaxed),
                  g_q3k_wide.load(std::memory_order_relaxed), g_kq_mma.load(std::memory_order_relaxed),
                  g_mma_slices.load(std::memory_order_relaxed)};
}
// Threads per row group (log2) of the unsplit kernel. Fewer threads than the row
// has units give each lane several units (MXFP4's loaded one ahead: kPipelines)
// summed without the group's shared-memory round, which pays as far as measured
// (bench-kernels --row-threads, doc/kernels.md):
// - MXFP4 and Q8_0: 64 threads from 128 units on (H200, 2026-12-03: at one token
//   DeepSeek-V4's expert gate/up 1.04x, 14336 inputs 1.15x) and 32 below (its
//   expert down 1.11x);
// - Q2_K and Q3_K: 32 from 128 units on (16384 inputs 1.10x; at 112 units, 14336
//   inputs, Q3_K lost 5 % with 32 and keeps 64);
// - Q4_K, Q5_K and Q6_K's dp4a units: 32 from 112 units on (H100, 2026-12-06,
//   against the rule before: at 14336 inputs 1.04-1.08x at one token and 1.04-1.09x
//   at eight; at 16384 inputs 1.00x, 1.00x and 1.11x at one token, 1.37-1.42x at
//   eight; Q6_K above the L2 went from 68 % of the copy bandwidth to 75 %);
// - the other types: tpr_log2_for's, not measured otherwise.
// Never from the token count: a grouped launch takes its largest problem's, and
// each problem's rows must still equal its product alone, bit for bit.
// g.row_threads, where bench-kernels sets it, caps tpr_log2_for's instead (128: the
// layout before this rule); 256 gives rows of 256 units and more a whole block of
// 256 threads, the rows in flight half the bytes: asked of F32 at 16384 inputs (57 %
// of the copy bandwidth, where llama.cpp reads at the copy's), it gave 56.6 % (H100,
// 2026-12-06), so the rows' span is not what holds F32 back.
template <class Ty>
int row_tpr_log2(int units, const Geometry& g) {
  const int natural = tpr_log2_for(units);
  if (g.row_threads == 256) return units >= 256 ? 8 : natural;
  if (g.row_threads != 0) return std::min(natural, g.row_threads == 32 ? 5 : g.row_threads == 64 ? 6 : 7);
  if constexpr (std::is_same_v<Ty, TMXFP4> || std::is_same_v<Ty, TMXFP4_8> || std::is_same_v<Ty, TQ8_0>)
    return std::min(natural, units >= 128 ? 6 : 5);
  if constexpr (std::is_same_v<Ty, TQ2_K> || std::is_same_v<Ty, TQ2_K8> || std::is_same_v<Ty, TQ3_K> ||
                kQ3K8<Ty>)
    return units >= 128 ? 5 : natural;
  if constexpr (std::is_same_v<Ty, TQ45_K8<false>> || std::is_same_v<Ty, TQ45_K8<true>> || std::is_same_v<Ty, TQ6_K8>)
    return units >= 112 ? 5 : natural;
  return natural;
}

// Resident blocks per SM of the staged-x kernel in blocks of kBlock threads (0: it
// cannot run here).
template <class Ty, int NT, int R, int kBlock, bool kPipe>
int smem_x_blocks_per_sm(size_t smem) {
  auto* k = matvec_kernel<Ty, NT, R, true, kBlock, kPipe>;
  static const bool attr_ok =
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmemX)) == cudaSuccess;
  static OccupancyCache occ;
  return attr_ok ? occ.blocks(k, kBlock, smem) : 0;
}

// The kernel with x staged in shared memory, its blocks looping over row groups, as
// many as fit on the GPU at once: one wave for the whole launch (each block then
// stages x once for more rows: the problems of a grouped launch had made a wave each
// of short-lived blocks), or one per problem. cudaErrorNotSupported, nothing
// launched, where the device cannot run it.
template <class Ty, int NT, int R, int kBlock, bool kPipe>
cudaError_t launch_smem_x(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y,
                          size_t smem, const Geometry& g, cudaStream_t stream) {
  auto* k = matvec_kernel<Ty, NT, R, true, kBlock, kPipe>;
  const int per_sm = smem_x_blocks_per_sm<Ty, NT, R, kBlock, kPipe>(smem);
  const int sms = sm_count();
  if (per_sm <= 0 || sms <= 0) return cudaErrorNotSupported;
  const int tpr_log2 = row_tpr_log2<Ty>(ne0 / Ty::kUnit, g);
  const int rows_per_block = (kBlock >> tpr_log2) * R;
  const int blocks = (ne1 + rows_per_block - 1) / rows_per_block;
  const int probs = gp.shared ? 1 : gp.n;  // products of one input share one row of blocks
  const int wave = g.shared_wave ? std::max(1, sms * per_sm / probs) : sms * per_sm;
  const dim3 grid(unsigned(std::min(blocks, wave)), unsigned(probs));
  if constexpr (kTermsX<Ty>) {
    if (gp.terms) {
      // After stage_terms_kernel (or the pass before), as its programmatic dependent:
      // the kernel waits for it before reading the terms. A grid that does not signal
      // (the passes' products) lets its dependent start only as it ends, as usual.
      cudaLaunchAttribute attr[1] = {};
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = grid;
      cfg.blockDim = dim3(unsigned(kBlock));
      cfg.dynamicSmemBytes = smem;
      cfg.stream = stream;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      return cudaLaunchKernelEx(&cfg, k, gp, ne0, ne1, rb, x, y, tpr_log2, g.group_bar);
    }
  }
  k<<<grid, kBlock, smem, stream>>>(gp, ne0, ne1, rb, x, y, tpr_log2, g.group_bar);
  return cudaGetLastError();
}

template <class Ty, int NT, bool kPipe>
cudaError_t launch_unsplit(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y,
                           const Geometry& geom, cudaStream_t stream) {
  constexpr int R = rows_per_group<Ty, NT>();
  const int units = ne0 / Ty::kUnit;
  const int tpr_log2 = row_tpr_log2<Ty>(units, geom);
  const int rows_per_block = (kThreads >> tpr_log2) * R;
  const int blocks = (ne1 + rows_per_block - 1) / rows_per_block;
  if constexpr (kStagesX<Ty>) {
    const size_t smem = size_t(NT) * size_t(units) * staged_floats<Ty>() * sizeof(float);
    if (smem <= kMaxSmemX) {
      Geometry g = geom;
      if (g.block == 0) {
        // 512 threads where that keeps more warps resident (x is then staged once for
        // more of them) and the launch still gives every SM a block. Measured on the
        // H200 (doc/kernels.md): +15-18 % for MXFP4 and Q8_0 14336-wide rows, where
        // 24 resident warps became 32; 0.7x for Q2_K/Q3_K experts (48 blocks for 132
        // SMs) and 0.9x for large K-quant matrices whose registers allow no more warps.
        // Q3_K's dp4a unit, whose registers allow 16 warps either way, takes 512
        // whatever the grid (H100, 2026-12-06, bench-kernels --block-threads 512 against
        // this rule: Kimi-K3's expert down 1.16x alone and 1.04x in groups of 16 and
        // 114, 16384 inputs 1.02x, 14336 inputs 0.98-1.03x, eight tokens 1.00-1.06x).
        const int b256 = smem_x_blocks_per_sm<Ty, NT, R, kThreads, kPipe>(smem);
        const int b512 = smem_x_blocks_per_sm<Ty, NT, R, 512, kPipe>(smem);
        const int rows512 = (512 >> tpr_log2) * R;
        const long long blocks512 = (ne1 + rows512 - 1) / rows512 * (long long)(gp.shared ? 1 : gp.n);
        if constexpr (kQ3K8<Ty>)
          g.block = b512 > 0 && 2 * b512 >= b256 ? 512 : kThreads;
        else
          g.block = 2 * b512 > b256 && blocks512 >= sm_count() ? 512 : kThreads;
      }
      const cudaError_t e = g.block == 512
                                ? launch_smem_x<Ty, NT, R, 512, kPipe>(gp, ne0, ne1, rb, x, y, smem, g, stream)
                                : launch_smem_x<Ty, NT, R, kThreads, kPipe>(gp, ne0, ne1, rb, x, y, smem, g, stream);
      if (e != cudaErrorNotSupported) return e;
      (void)cudaGetLastError();  // fall back to x from global memory
    }
  }
  if constexpr (kTermsX<Ty>) {
    return cudaErrorNotSupported;  // dp4a_takes rules this out
  } else {
    const dim3 grid(unsigned(blocks), unsigned(gp.shared ? 1 : gp.n));
    matvec_kernel<Ty, NT, R, false, kThreads, kPipe>
        <<<grid, kThreads, 0, stream>>>(gp, ne0, ne1, rb, x, y, tpr_log2, geom.group_bar);
    return cudaGetLastError();
  }
}

template <class Ty, int NT>
cudaError_t launch_nt(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y,
                      const Split& sp, const MatvecScratch* sc, const Geometry& geom, cudaStream_t stream) {
  if constexpr (!kTermsX<Ty>) {
    if (sp.chunks > 1) return launch_split<Ty, NT>(gp, ne0, ne1, rb, x, y, sp, *sc, stream);
  }
  if (kPipelines<Ty> && geom.pipeline) return launch_unsplit<Ty, NT, kPipelines<Ty>>(gp, ne0, ne1, rb, x, y, geom, stream);
  return launch_unsplit<Ty, NT, false>(gp, ne0, ne1, rb, x, y, geom, stream);
}

// Whether sc can take the split of a problem of ne1 rows at any token count:
// the answer depends on the shape and the context, not on the launch.
inline bool split_fits(const MatvecScratch* sc, int ne1, const Split& sp) {
  if (!sc || !sc->partial || !sc->counters) return false;
  const size_t floats = size_t(kMaxMatvecTokens) * size_t(ne1) * size_t(sp.chunks);
  const size_t counters = size_t(kMaxGroupedProblems) * size_t((ne1 + 1) / 2);  // R >= 2
  return sc->partial_bytes / sizeof(float) >= floats && sc->n_counters >= counters;
}

// Inputs from which the rule below takes MXFP4 rows to the tensor cores (H200, one
// token, doc/kernels.md: 1.04-1.29x from 3584 inputs on, 1.00x at 2048).
constexpr int kMmaMinInputs = 3584;

// How full, in percent, the rounds of the device's concurrent tiles are over a
// matrix of ne1 rows (one block of 16 warps an SM, 16 / warps tiles a block); 0 on
// an unknown device.
int mma_round_fill(int64_t ne1, int warps) {
  const long long slots = (long long)sm_count() * (16 / warps);
  if (slots <= 0) return 0;
  const long long tiles = (ne1 + 15) / 16;
  const long long rounds = (tiles + slots - 1) / slots;
  return int(100 * tiles / (rounds * slots));
}

// The tensor-core layout of a problem of ne1 rows at n_tokens (set_matvec_geometry's,
// or by default by its shape and token count, so grouped launches equal separate
// ones bit for bit): at one token 4 x 4; from two tokens on 16 x 1 where 4 x 4's
// rounds are less than kMmaWideBelowFill full, 4 x 4 elsewhere. Measured on an H100
// (2026-12-07, bench-kernels --mma-decode with and without --mma-warps 16
// --mma-tiles 1, sliced, doc/kernels.md): 16 x 1 was faster at 2-8 tokens on 4096
// rows (48 %: 1.35-1.37x at 14336 inputs) and 12288 (73 %: 1.07-1.13x at 7168),
// slower on 7168 (85 %: 0.74-0.83x at 12288 inputs), 33792 and 163840 rows (100 %,
// 97 %: 0.82-0.90x); at one token 16 x 1 unsliced lost to the units chosen before.
constexpr int kMmaWideBelowFill = 80;
MmaLayout mma_layout_for(const Geometry& g, int64_t ne1, int n_tokens) {
  if (g.mma_layout != MmaLayout::kAuto) return g.mma_layout;
  return n_tokens >= 2 && mma_round_fill(ne1, 4) < kMmaWideBelowFill ? MmaLayout::k16x1 : MmaLayout::k4x4;
}

// Whether an unsplit MXFP4 decode of a problem of ne1 rows of ne0 inputs at n_tokens
// runs on the tensor cores: a function of the problem's shape, its token count and
// the device, never of the launch's other problems (a grouped launch takes its
// problems of one token apart from the others, and products of one input are split
// so that their rule agrees: both equal separate launches bit for bit). By
// default: rows of whole groups of 16 blocks, at least kMmaMinInputs long; from two
// tokens on every such matrix, in the layout mma_layout_for gives (H100,
// 2026-12-07: 14336 inputs x 4096 rows 1.14x, 1.88x and 2.19x the dp4a units at 2,
// 4 and 8 tokens; DeepSeek-V4's expert gate/up, 4096 x 2048, 1.05x, 1.18x, 1.06x); at
// one token where it was measured faster there (doc/kernels.md, "MXFP4 on the int8
// tensor cores"): enough tiles of 16 rows that the rounds of the device's concurrent
// tiles are at least 70 % full. The kernel keeps a tile's 16 rows together, so a
// matrix of 12288 rows (768 tiles) on 132 SMs x 4 tiles takes two rounds, 73 % full:
// 0.92x the FMA kernel at first, 1.00x since its blocks lost the rare exponents'
// inline path (2026-12-03); 7168 rows (85 %) gave 1.21x and 163840 rows (97 %)
// 1.38x; 4096 rows (48 %) 0.74x.
bool mma_takes(const Geometry& g, int64_t ne0, int64_t ne1, int n_tokens) {
  if (g.mma_decode == kMmaDecodeNever || ne0 % 512 != 0) return false;
  if (g.mma_decode == kMmaDecodeAlways) return true;
  if (ne0 < kMmaMinInputs) return false;
  if (n_tokens >= 2) return true;
  const MmaLayout l = mma_layout_for(g, ne1, n_tokens);
  const int warps = l == MmaLayout::k16x1 ? 16 : l == MmaLayout::k8x2 ? 8 : 4;
  return 10 * mma_round_fill(ne1, warps) >= 7 * 100;
}

// The MXFP4 decode kernel a problem gets: 0 the units without tensor cores, else 1 +
// the tensor cores' layout. Problems that share a launch must agree on it.
int mma_kernel(const Geometry& g, int64_t ne0, int64_t ne1, int n_tokens) {
  return mma_takes(g, ne0, ne1, n_tokens) ? 1 + int(mma_layout_for(g, ne1, n_tokens)) : 0;
}

// launch_nt at the launch's token count rounded up to 1, 2, 4, 8: a problem with
// fewer tokens skips the extra ones.
template <class Ty>
cudaError_t launch_rounded(int nt_max, const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y,
                           const Split& sp, const MatvecScratch* sc, const Geometry& geom, cudaStream_t stream) {
  if (nt_max <= 1) return launch_nt<Ty, 1>(gp, ne0, ne1, rb, x, y, sp, sc, geom, stream);
  if (nt_max <= 2) return launch_nt<Ty, 2>(gp, ne0, ne1, rb, x, y, sp, sc, geom, stream);
  if (nt_max <= 4) return launch_nt<Ty, 4>(gp, ne0, ne1, rb, x, y, sp, sc, geom, stream);
  return launch_nt<Ty, 8>(gp, ne0, ne1, rb, x, y, sp, sc, geom, stream);
}

// Tokens whose x (or the dp4a units' terms) the staged kernel holds at once (8, 4,
// 2 or 1): the most that fit. A launch of more tokens goes in passes of that many
// (launch_passes), each a launch of its own that reads the weights again; each
// token's sums are its own, so the passes change no bit. 0: not even one token's fit.
template <class Ty, int P>
bool staged_fits(size_t token_bytes) {
  const size_t smem = size_t(P) * token_bytes;
  return smem <= kMaxSmemX && smem_x_blocks_per_sm<Ty, P, rows_per_group<Ty, P>(), kThreads, false>(smem) > 0;
}
template <class Ty>
int staged_pass_tokens(int64_t ne0) {
  const size_t token = size_t(ne0 / Ty::kUnit) * staged_floats<Ty>() * sizeof(float);
  static_assert(kMaxMatvecTokens == 8);
  return staged_fits<Ty, 8>(token)   ? 8
         : staged_fits<Ty, 4>(token) ? 4
         : staged_fits<Ty, 2>(token) ? 2
         : staged_fits<Ty, 1>(token) ? 1
                                     : 0;
}

// launch_rounded in passes of `pass` tokens: pass k takes each problem's tokens
// from k * pass on (rows of x and y alike), problems with none left dropped.
// Products of one input (gp.shared) all have the launch's tokens, so none drops
// and their y and ne1 keep their places.
template <class Ty>
cudaError_t launch_passes(int pass, int nt_max, const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x,
                          float* y, const MatvecScratch* sc, const Geometry& geom, cudaStream_t stream) {
  for (int t0 = 0; t0 < nt_max; t0 += pass) {
    GroupParams sub = gp;
    sub.n = 0;
    for (int i = 0; i < gp.n; ++i) {
      if (gp.ntok[i] <= t0) continue;
      sub.w[sub.n] = gp.w[i];
      sub.row[sub.n] = gp.row[i] + t0;
      sub.ntok[sub.n] = std::min(pass, gp.ntok[i] - t0);
      sub.trow[sub.n] = gp.trow[i] + t0;
      ++sub.n;
    }
    if (sub.n == 0) continue;
    const cudaError_t e =
        launch_rounded<Ty>(std::min(pass, nt_max - t0), sub, ne0, ne1, rb, x, y, Split{}, sc, geom, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Whether an unsplit K-quant or MXFP4 decode of rows of ne0 inputs takes the dp4a unit
// Ty: where one token's terms fit the staged kernel on this device (on an H200 up
// to 46720 inputs), a function of ne0 and the device alone, so that grouped
// launches equal separate ones bit for bit; longer rows keep the FMA unit.
template <class Ty>
bool dp4a_takes(const Geometry& g, int64_t ne0) {
  return g.dp4a && staged_pass_tokens<Ty>(ne0) >= 1;
}

// The dp4a launch, in passes of staged_pass_tokens where its tokens' terms do not
// fit at once.
//
// Where the scratch holds them and prestage_pays, the launch's terms are made once
// first (stage_terms_kernel): every block of the product then copies them instead
// of making its own. Both give the same bytes, so the choice changes no bit and may
// depend on the launch.
//
// Measured on the H200 (2026-12-05, bench-kernels --no-prestage against the
// default, doc/kernels.md): made once, rows of 14336 inputs took 0.62-0.80 of the
// time at one token and 0.58-0.69 at eight, experts of 2048-4096 inputs 0.52-0.62 at
// eight; but experts at one token took 1.14-1.38 alone and 1.01-1.14 in groups of
// 6-128 (one launch more, about 2 us, for little staging each block). Hence: at
// one token only rows of kPrestageMinInputs and more (matvec_launch.cuh), between
// the two measured lengths.

template <class Ty>
cudaError_t launch_dp4a(int nt_max, const GroupParams& gp_in, int ne0, int ne1, size_t rb, const float* x, float* y,
                        const MatvecScratch* sc, const Geometry& geom, cudaStream_t stream) {
  GroupParams gp = gp_in;
  gp.terms = nullptr;
  const int probs = gp.shared ? 1 : gp.n;  // products of one input stage it once
  int64_t rows = 0;
  for (int i = 0; i < probs; ++i) {
    gp.trow[i] = int32_t(rows);
    rows += gp.ntok[i];
  }
  const size_t unit_bytes = size_t(4) * Ty::kXs;
  const int units = ne0 / Ty::kUnit;
  const bool once = geom.prestage == kPrestageAlways || (geom.prestage == kPrestageAuto && prestage_pays(nt_max, ne0));
  if (once && sc && sc->partial && size_t(rows) * size_t(units) * unit_bytes <= sc->partial_bytes) {
    constexpr int kItemsPerBlock = 4 * (kThreads / 32);
    const int per_problem = (nt_max * units + kItemsPerBlock - 1) / kItemsPerBlock;
    const dim3 grid{unsigned(per_problem), unsigned(probs)};
    stage_terms_kernel<Ty><<<grid, kThreads, 0, stream>>>(gp, ne0, x, reinterpret_cast<uint8_t*>(sc->partial));
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    gp.terms = reinterpret_cast<const uint8_t*>(sc->partial);
  }
  if (gp.shared)
    for (int i = 1; i < gp.n; ++i) gp.trow[i] = 0;
  const int pass = staged_pass_tokens<Ty>(ne0);
  if (nt_max <= pass) return launch_rounded<Ty>(nt_max, gp, ne0, ne1, rb, x, y, Split{}, sc, geom, stream);
  return launch_passes<Ty>(pass, nt_max, gp, ne0, ne1, rb, x, y, sc, geom, stream);
}

// Whether Q3_K's dp4a unit loads 16-byte windows (the same bits either way), by
// default where that was measured faster on an H100 (2026-12-06, bench-kernels
// --q3k-wide-loads, doc/kernels.md): matrices larger than the L2, 1.06-1.10x at 1-3
// tokens (16384 x 32768 at one token 112.4 -> 102.7 us); a lone product at one
// token, 1.04-1.06x on 14336 x 4096 and 1.00-1.01x on Kimi-K3's expert. Not grouped
// launches of matrices within the L2 (0.99x at 114 experts) nor 2-3 tokens there.
bool q3k_wide_takes(const Geometry& g, int n_problems, int n_tokens, int64_t ne1, size_t rb) {
  if (g.q3k_wide != kSwitchAuto) return g.q3k_wide == kSwitchOn;
  return size_t(ne1) * rb > l2_bytes() || (n_problems == 1 && n_tokens == 1);
}

// Whether Q2_K and Q3_K rows (ne1 of rb bytes) of a problem of n_tokens take the
// int8 tensor cores (kquant_mmv.cu): where a context's scratch holds their staged x,
// with kMmaDecodeAuto from four tokens on, and from two where the matrix fits the L2.
// Measured on an H100 (2026-12-06, bench-kernels --kq-mma-decode against the dp4a
// units, doc/kernels.md): at eight tokens 1.8-3.6x, at four 1.1-2.8x; at two 1.07-1.66x
// on matrices of 3-25 MB but 0.60-0.95x on 176-231 MB ones, whose loads straight from
// the rows do not keep DRAM busy; at one token 0.41-1.08x.
bool kq_takes(const Geometry& g, const MatvecScratch* sc, int ne0, int64_t ne1, size_t rb, int n_tokens) {
  if (g.kq_mma == kMmaDecodeNever || !sc || !sc->partial || kq_stage_bytes(ne0, n_tokens) > sc->partial_bytes)
    return false;
  return g.kq_mma == kMmaDecodeAlways || n_tokens >= 4 || (n_tokens >= 2 && size_t(ne1) * rb <= l2_bytes());
}

// A grouped launch's problems (not products of one input) whose token count
// satisfies pred (on) and the others (off), for a unit whose rule depends on it:
// each problem then gets the unit it would alone.
template <class Pred>
void partition_problems(const GroupParams& gp, Pred pred, GroupParams& on, GroupParams& off) {
  on = gp;
  off = gp;
  on.n = off.n = 0;
  for (int i = 0; i < gp.n; ++i) {
    GroupParams& to = pred(int(gp.ntok[i])) ? on : off;
    to.w[to.n] = gp.w[i];
    to.row[to.n] = gp.row[i];
    to.ntok[to.n] = gp.ntok[i];
    ++to.n;
  }
}
inline int max_tokens(const GroupParams& gp) {
  int nt = 1;
  for (int i = 0; i < gp.n; ++i) nt = std::max(nt, int(gp.ntok[i]));
  return nt;
}

// The dp4a unit for each FMA unit (void: none).
template <class Ty> struct Dp4aOf { using type = void; };
template <> struct Dp4aOf<TQ2_K> { using type = TQ2_K8; };
template <> struct Dp4aOf<TQ3_K> { using type = TQ3_K8; };
template <> struct Dp4aOf<TQ45_K<false>> { using type = TQ45_K8<false>; };
template <> struct Dp4aOf<TQ45_K<true>> { using type = TQ45_K8<true>; };
template <> struct Dp4aOf<TQ6_K> { using type = TQ6_K8; };
template <> struct Dp4aOf<TMXFP4> { using type = TMXFP4_8; };
template <class Ty>
using Dp4aUnit = typename Dp4aOf<Ty>::type;

template <class Ty>
cudaError_t launch_type(int nt_max, const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x,
                        float* y, const MatvecScratch* sc, cudaStream_t stream) {
  const Geometry geom = geometry();  // one layout for the whole launch
  if constexpr (std::is_same_v<Ty, TQ2_K> || std::is_same_v<Ty, TQ3_K>) {
    // A problem takes the tensor cores by its own token count: the rule's, and a
    // scratch that holds its x staged (at the launch's count the launch is cut
    // into as many as the scratch holds, kquant_mmv.cu).
    // Products of one input were split so that their rule agrees (shared_input_matvec).
    const int64_t rows = gp.shared ? gp.ne1[0] : ne1;
    const auto takes = [&](int nt) { return kq_takes(geom, sc, ne0, rows, rb, nt); };
    // The rule grows with the token count and the scratch's room shrinks with it, so
    // a problem of any count up to nt_max may take it where those at 1 and nt_max do
    // not: every count is asked before the problem lists (4 KB each) are made.
    GroupParams on, off;
    on.n = off.n = 0;
    if (gp.shared) {  // one token count for all
      if (takes(nt_max)) on = gp;
    } else {
      bool any = false;
      for (int nt = 1; nt <= nt_max && !any; ++nt) any = takes(nt);
      if (any) partition_problems(gp, takes, on, off);
    }
    if (on.n > 0) {
      if (off.n > 0)
        if (const cudaError_t e = launch_type<Ty>(max_tokens(off), off, ne0, ne1, rb, x, y, sc, stream);
            e != cudaSuccess)
          return e;
      constexpr uint32_t kType = std::is_same_v<Ty, TQ2_K> ? kQ2_K : kQ3_K;
      return launch_kq_mmv(kType, on, ne0, ne1, rb, x, y, gp.shared ? nt_max : max_tokens(on),
                           reinterpret_cast<uint8_t*>(sc->partial), sc->partial_bytes, stream);
    }
  }
  // Products of one input are never split (shared_input_matmul sends those that
  // would be to launches of their own); their scratch is for the dp4a terms.
  Split sp = sc && !gp.shared ? split_plan<Ty>(ne0, ne1) : Split{};
  if (sp.chunks > 1 && !split_fits(sc, ne1, sp)) sp = Split{};  // the unsplit kernel
  if constexpr (std::is_same_v<Ty, TMXFP4>) {
    // Products of one input were split so that their rule agrees (shared_input_matvec):
    // the first one's rows decide for all.
    const int64_t rows = gp.shared ? gp.ne1[0] : ne1;
    if (sp.chunks <= 1 && !gp.shared && nt_max > 1 &&
        mma_kernel(geom, ne0, rows, 1) != mma_kernel(geom, ne0, rows, 2)) {
      // The rule's answer at one token differs from the one at more (the same at 2
      // to 8): each problem takes its own, the ones of one token in a launch apart.
      // A layout counts only where the tensor cores take the problem.
      GroupParams one, more;
      partition_problems(gp, [](int nt) { return nt == 1; }, one, more);
      if (one.n > 0 && more.n > 0) {
        if (const cudaError_t e = launch_type<Ty>(1, one, ne0, ne1, rb, x, y, sc, stream); e != cudaSuccess) return e;
        return launch_type<Ty>(max_tokens(more), more, ne0, ne1, rb, x, y, sc, stream);
      }
    }
    if (sp.chunks <= 1 && mma_takes(geom, ne0, rows, nt_max)) {
      const MmaOptions st{sc ? reinterpret_cast<uint8_t*>(sc->partial) : nullptr, sc ? sc->partial_bytes : 0,
                          geom.prestage, geom.mma_one_product, geom.mma_slices};
      const cudaError_t e = launch_mxfp4_mmv(gp, ne0, ne1, rb, x, y, nt_max, mma_layout_for(geom, rows, nt_max),
                                             geom.shared_wave, st, stream);
      if (e != cudaErrorNotSupported) return e;
      (void)cudaGetLastError();  // the FMA kernel below
    }
  }
  if constexpr (!std::is_void_v<Dp4aUnit<Ty>>) {
    if (sp.chunks <= 1 && dp4a_takes<Dp4aUnit<Ty>>(geom, ne0)) {
      if constexpr (std::is_same_v<Ty, TQ3_K>) {
        if (q3k_wide_takes(geom, gp.n, nt_max, ne1, rb))
          return launch_dp4a<TQ3_K8W>(nt_max, gp, ne0, ne1, rb, x, y, sc, geom, stream);
      }
      return launch_dp4a<Dp4aUnit<Ty>>(nt_max, gp, ne0, ne1, rb, x, y, sc, geom, stream);
    }
  }
  if constexpr (kStagesX<Ty>) {
    // Tokens whose x does not fit shared memory at once go in passes that do: x
    // read from L1 at a unit's stride made Q8_0 at 3 to 8 tokens 4-5x slower than at
    // two (H100, 2026-12-06, bench-kernels --tokens: 14336 inputs 131 us at 3 and 4
    // tokens, 31 us at 2; 16384 inputs 1161 us against 218).
    const int pass = staged_pass_tokens<Ty>(ne0);
    if (sp.chunks <= 1 && pass >= 1 && nt_max > pass)
      return launch_passes<Ty>(pass, nt_max, gp, ne0, ne1, rb, x, y, sc, geom, stream);
  }
  return launch_rounded<Ty>(nt_max, gp, ne0, ne1, rb, x, y, sp, sc, geom, stream);
}

}  // namespace dev

namespace {

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

int check_shape(uint32_t type, int64_t ne0, int64_t ne1) {
  if (block_elems(type) == 0) return kErrType;
  if (ne0 <= 0 || ne1 <= 0 || ne0 % block_elems(type) != 0) return kErrShape;
  if (ne0 > (int64_t(1) << 30) || ne1 > (int64_t(1) << 30)) return kErrShape;
  return kOk;
}

// Float types take the 16-byte vector path when every row is whole vectors.
bool vector_rows(uint32_t type, int64_t ne0, const dev::GroupParams& gp) {
  if (ne0 % 8 != 0) return false;
  for (int i = 0; i < gp.n; ++i)
    if (!aligned(gp.w[i], 16)) return false;
  (void)type;
  return true;
}

// F32's vector unit (TF32V) for a problem of n_tokens: by default (variant -1)
// units of 4 floats at one token, of 8 with plain loads from two on. Measured on
// H100s (2026-12-06, bench-kernels --f32-variant and the tree before against this
// one, graphs replayed, doc/kernels.md): at one token units of 4 read 2.1 GB at
// 102-104 % of the copy bandwidth, 1.56-1.57x units of 8 (58.7 %), and rows of 14336
// inputs 1.01-1.02x; at eight tokens they took 0.60-0.64x. Units of 8 through the
// read-only path (1, the same bits as 0) gave 1.00x at eight tokens but 0.96x at
// three on the 2.1 GB matrix.
int f32_unit(int n_tokens) {
  const int v = dev::g_f32_variant.load(std::memory_order_relaxed);
  if (v >= 0) return v;
  return n_tokens == 1 ? 2 : 0;
}

cudaError_t launch_f32_unit(int unit, const dev::GroupParams& gp, int nt_max, int n0, int n1, size_t rb,
                            const float* x, float* y, const dev::MatvecScratch* sc, cudaStream_t s) {
  using namespace dev;
  if (unit == 2) return launch_type<TF32V<2>>(nt_max, gp, n0, n1, rb, x, y, sc, s);
  if (unit == 1) return launch_type<TF32V<1>>(nt_max, gp, n0, n1, rb, x, y, sc, s);
  return launch_type<TF32>(nt_max, gp, n0, n1, rb, x, y, sc, s);
}

// The unit follows each problem's own token count, so that a problem's rows equal
// its launch alone bit for bit: a grouped launch that mixes one-token problems with
// longer ones takes the one-token problems in a launch of their own.
cudaError_t launch_f32(const dev::GroupParams& gp, int nt_max, int n0, int n1, size_t rb, const float* x, float* y,
                       const dev::MatvecScratch* sc, cudaStream_t s) {
  const int unit = f32_unit(nt_max);
  if (gp.shared || f32_unit(1) == unit) return launch_f32_unit(unit, gp, nt_max, n0, n1, rb, x, y, sc, s);
  dev::GroupParams one, more;
  dev::partition_problems(gp, [](int nt) { return nt == 1; }, one, more);
  if (one.n > 0)
    if (const cudaError_t e = launch_f32_unit(f32_unit(1), one, 1, n0, n1, rb, x, y, sc, s); e != cudaSuccess)
      return e;
  return launch_f32_unit(unit, more, nt_max, n0, n1, rb, x, y, sc, s);
}

int launch(uint32_t type, int64_t ne0, int64_t ne1, const dev::GroupParams& gp, int nt_max,
           const float* x, float* y, const dev::MatvecScratch* sc, cudaStream_t s) {
  using namespace dev;
  const int n0 = int(ne0), n1 = int(ne1);
  const size_t rb = row_bytes(type, ne0);
  cudaError_t e = cudaSuccess;
  const bool vec = vector_rows(type, ne0, gp) && aligned(x, 16);
  switch (type) {
    case kF32:
      e = vec ? launch_f32(gp, nt_max, n0, n1, rb, x, y, sc, s)
              : launch_type<TScalar<kF32>>(nt_max, gp, n0, n1, rb, x, y, sc, s);
      break;
    case kF16:
      e = vec ? launch_type<THalf<false>>(nt_max, gp, n0, n1, rb, x, y, sc, s)
              : launch_type<TScalar<kF16>>(nt_max, gp, n0, n1, rb, x, y, sc, s);
      break;
    case kBF16:
      e = vec ? launch_type<THalf<true>>(nt_max, gp, n0, n1, rb, x, y, sc, s)
              : launch_type<TScalar<kBF16>>(nt_max, gp, n0, n1, rb, x, y, sc, s);
      break;
    case kQ8_0: e = launch_type<TQ8_0>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    case kMXFP4: e = launch_type<TMXFP4>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    case kQ2_K: e = launch_type<TQ2_K>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    case kQ3_K: e = launch_type<TQ3_K>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    case kQ4_K: e = launch_type<TQ45_K<false>>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    case kQ5_K: e = launch_type<TQ45_K<true>>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    case kQ6_K: e = launch_type<TQ6_K>(nt_max, gp, n0, n1, rb, x, y, sc, s); break;
    default: return kErrType;
  }
  return e == cudaSuccess ? kOk : kErrCuda;
}

bool is_float_type(uint32_t t) { return t == kF32 || t == kF16 || t == kBF16; }

// Quantized rows need 16-byte aligned weights (the Q4_K/Q5_K loads are 16 bytes
// wide and every block's fields are found from the row start); float types may
// take the scalar path, which needs element alignment only.
bool weight_aligned(uint32_t type, const void* w) {
  if (!is_float_type(type)) return aligned(w, 16);
  return aligned(w, type == kF32 ? 4 : 2);
}

}  // namespace

void dev::set_group_barrier(bool on) { g_group_bar.store(on, std::memory_order_relaxed); }

void dev::set_q3k_wide_loads(int mode) {
  g_q3k_wide.store(mode == kSwitchOn || mode == kSwitchOff ? mode : kSwitchAuto, std::memory_order_relaxed);
}

void dev::set_mma_slices(int mode) {
  g_mma_slices.store(mode == kSwitchOn || mode == kSwitchOff ? mode : kSwitchAuto, std::memory_order_relaxed);
}

void dev::set_kq_mma(int mode) {
  g_kq_mma.store(mode == kMmaDecodeAlways || mode == kMmaDecodeNever ? mode : kMmaDecodeAuto,
                 std::memory_order_relaxed);
}

void dev::set_f32_variant(int variant) {
  g_f32_variant.store(variant >= 0 && variant <= 2 ? variant : -1, std::memory_order_relaxed);
}

void dev::set_matvec_geometry(int block_threads, bool shared_wave, int row_threads, bool pipeline, int mma_decode,
                              int mma_warps, int mma_tiles, bool dp4a, int prestage, bool mma_one_product) {
  g_pipeline.store(pipeline, std::memory_order_relaxed);
  g_mma_one_product.store(mma_one_product, std::memory_order_relaxed);
  g_dp4a.store(dp4a, std::memory_order_relaxed);
  g_prestage.store(prestage == kPrestageNever || prestage == kPrestageAlways ? prestage : kPrestageAuto,
                   std::memory_order_relaxed);
  g_mma_decode.store(mma_decode == kMmaDecodeAlways || mma_decode == kMmaDecodeNever ? mma_decode : kMmaDecodeAuto,
                     std::memory_order_relaxed);
  const MmaLayout layout = mma_warps == 16                   ? MmaLayout::k16x1
                           : mma_warps == 8                  ? MmaLayout::k8x2
                           : mma_tiles == 2                  ? MmaLayout::k4x2
                           : mma_warps == 4 || mma_tiles == 4 ? MmaLayout::k4x4
                                                              : MmaLayout::kAuto;
  g_mma_layout.store(int(layout), std::memory_order_relaxed);
  g_block.store(block_threads == 512 || block_threads == kThreads ? block_threads : 0, std::memory_order_relaxed);
  g_shared_wave.store(shared_wave, std::memory_order_relaxed);
  g_row_threads.store(row_threads == 32 || row_threads == 64 || row_threads == 128 || row_threads == 256 ? row_threads : 0,
                      std::memory_order_relaxed);
}

int matvec(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x, int n_tokens,
           float* y, cudaStream_t stream) {
  ExpertProblem p{w, 0, n_tokens};
  return dev::grouped_matvec_scratch(nullptr, type, ne0, ne1, &p, 1, x, y, n_tokens, stream);
}

int grouped_matvec(uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* problems,
                   int n_problems, const float* x, float* y, int64_t n_rows, cudaStream_t stream) {
  return dev::grouped_matvec_scratch(nullptr, type, ne0, ne1, problems, n_problems, x, y, n_rows, stream);
}

int dev::grouped_matvec_scratch(const MatvecScratch* scratch, uint32_t type, int64_t ne0, int64_t ne1,
                                const ExpertProblem* problems, int n_problems, const float* x, float* y,
                                int64_t n_rows, cudaStream_t stream) {
  if (const int st = check_shape(type, ne0, ne1); st != kOk) return st;
  if (!problems || n_problems <= 0 || n_problems > kMaxGroupedProblems || !x || !y || n_rows <= 0)
    return kErrArgument;
  if (n_rows > (int64_t(1) << 30)) return kErrArgument;
  const uintptr_t xa = is_float_type(type) && ne0 % 8 != 0 ? 4 : 16;
  if (!aligned(x, xa) || !aligned(y, 4)) return kErrAlignment;
  dev::GroupParams gp{};
  gp.n = n_problems;
  int nt_max = 0;
  for (int i = 0; i < n_problems; ++i) {
    const ExpertProblem& p = problems[i];
    if (!p.w || p.n_tokens < 1 || p.n_tokens > kMaxMatvecTokens || p.row < 0 ||
        int64_t(p.row) + p.n_tokens > n_rows)
      return kErrArgument;
    if (!weight_aligned(type, p.w)) return kErrAlignment;
    gp.w[i] = static_cast<const uint8_t*>(p.w);
    gp.row[i] = p.row;
    gp.ntok[i] = p.n_tokens;
    nt_max = std::max(nt_max, p.n_tokens);
  }
  return launch(type, ne0, ne1, gp, nt_max, x, y, scratch, stream);
}

namespace dev {
namespace {
template <class Ty>
bool splits(const MatvecScratch* sc, int64_t ne0, int64_t ne1) {
  if (!sc) return false;
  const Split sp = split_plan<Ty>(int(ne0), int(ne1));
  return sp.chunks > 1 && split_fits(sc, int(ne1), sp);
}
}  // namespace
}  // namespace dev

bool dev::matvec_splits(const MatvecScratch* sc, uint32_t type, int64_t ne0, int64_t ne1, int n_tokens) {
  if (check_shape(type, ne0, ne1) != kOk) return false;
  const bool vec = ne0 % 8 == 0;
  switch (type) {
    case kF32:
      // Units of 4 floats are half as long as 8, so their split plan is their own.
      if (!vec) return splits<TScalar<kF32>>(sc, ne0, ne1);
      return f32_unit(n_tokens) == 2 ? splits<TF32V<2>>(sc, ne0, ne1) : splits<TF32>(sc, ne0, ne1);
    case kF16: return vec ? splits<THalf<false>>(sc, ne0, ne1) : splits<TScalar<kF16>>(sc, ne0, ne1);
    case kBF16: return vec ? splits<THalf<true>>(sc, ne0, ne1) : splits<TScalar<kBF16>>(sc, ne0, ne1);
    case kQ8_0: return splits<TQ8_0>(sc, ne0, ne1);
    case kMXFP4: return splits<TMXFP4>(sc, ne0, ne1);
    case kQ2_K:
    case kQ3_K:
      if (kq_takes(geometry(), sc, int(ne0), ne1, row_bytes(type, ne0), n_tokens)) return false;
      return type == kQ2_K ? splits<TQ2_K>(sc, ne0, ne1) : splits<TQ3_K>(sc, ne0, ne1);
    case kQ4_K: return splits<TQ45_K<false>>(sc, ne0, ne1);
    case kQ5_K: return splits<TQ45_K<true>>(sc, ne0, ne1);
    case kQ6_K: return splits<TQ6_K>(sc, ne0, ne1);
    default: return false;
  }
}

int dev::shared_input_matvec(uint32_t type, int64_t ne0, const SharedInputProduct* products, int n,
                             const float* x, int n_tokens, cudaStream_t stream, const MatvecScratch* sc) {
  if (!products || n <= 0 || n > kMaxSharedInputProducts || !x || n_tokens < 1 || n_tokens > kMaxMatvecTokens)
    return kErrArgument;
  // The launch's rows: every product's, each rounded up to whole row groups
  // (R <= 4 divides 8), which the kernel walks one product after another.
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    if (const int st = check_shape(type, ne0, products[i].ne1); st != kOk) return st;
    if (!products[i].w || !products[i].y) return kErrArgument;
    rows += (products[i].ne1 + 7) / 8 * 8;
  }
  if (n > 1 && rows > (int64_t(1) << 30)) {  // beyond one launch's int row count: a launch per product
    for (int i = 0; i < n; ++i)
      if (const int st = shared_input_matvec(type, ne0, products + i, 1, x, n_tokens, stream, sc); st != kOk) return st;
    return kOk;
  }
  const uintptr_t xa = is_float_type(type) && ne0 % 8 != 0 ? 4 : 16;
  if (!aligned(x, xa)) return kErrAlignment;
  if ((type == kMXFP4 || type == kQ2_K || type == kQ3_K) && n > 1) {
    // Each product on the kernel it would get alone: those the tensor cores take in
    // one launch, the rest in another.
    const dev::Geometry g = dev::geometry();
    // The kernel: 0 the units without tensor cores, else the tensor cores (MXFP4:
    // 1 + its layout, mma_kernel).
    const auto kernel = [&](int64_t ne1) {
      if (type == kMXFP4)
        return dev::mma_kernel(g, ne0, ne1, n_tokens);
      return dev::kq_takes(g, sc, int(ne0), ne1, row_bytes(type, ne0), n_tokens) ? 1 : 0;
    };
    // The first product's kernel in one launch, the others after (split again).
    SharedInputProduct on[kMaxSharedInputProducts], off[kMaxSharedInputProducts];
    int n_on = 0, n_off = 0;
    const int first = kernel(products[0].ne1);
    for (int i = 0; i < n; ++i) (kernel(products[i].ne1) == first ? on[n_on++] : off[n_off++]) = products[i];
    if (n_on > 0 && n_off > 0) {
      if (const int st = shared_input_matvec(type, ne0, on, n_on, x, n_tokens, stream, sc); st != kOk) return st;
      return shared_input_matvec(type, ne0, off, n_off, x, n_tokens, stream, sc);
    }
  }
  dev::GroupParams gp{};
  gp.n = n;
  gp.shared = 1;
  for (int i = 0; i < n; ++i) {
    const SharedInputProduct& p = products[i];
    if (!weight_aligned(type, p.w) || !aligned(p.y, 4)) return kErrAlignment;
    gp.w[i] = static_cast<const uint8_t*>(p.w);
    gp.row[i] = 0;
    gp.ntok[i] = n_tokens;
    gp.y[i] = p.y;
    gp.ne1[i] = int32_t(p.ne1);
  }
  // Only the dp4a units use the scratch here (products of one input never split).
  return launch(type, ne0, rows, gp, n_tokens, x, products[0].y, sc, stream);
}

}  // namespace xpack::kernels
