// MXFP4 decode (1..8 tokens) on the int8 tensor cores, within the fp32 bound.
// The default for the problems a rule of the shape and token count gives it
// (mma_takes in quant_matvec.cu): on the H200 (2026-12-03, doc/kernels.md) it is
// 1.2-1.4x the FMA kernel at one token on large matrices and 2.8-3.9x at eight, but
// slower at one token where its tiles of 16 rows leave SMs idle.
//
// Why: the FMA kernel (quant_matvec.cu) spends about six instructions a weight
// (SASS, 2026-12-03: decoding a nibble into an exact float takes four, then its
// FMA) and reached 39 % of the copy bandwidth on a 285 MB matrix; Kimi-K3's
// MXFP4 trunk is most of its decode step. An E2M1 code times two is a small
// integer (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12), so one byte permute turns four codes
// into four int8 weights, and the products run on mma.m16n8k32.s8 (about four
// instructions a weight here, the scaling of each block's sums included).
//
// x stays exact to fp32's precision: each token's 32-input chunk is scaled by a
// power of two so its largest |x| lies in [32, 64), then cut into four int8 terms
// q0 + q1/2^7 + q2/2^14 + q3/2^21 (each |q| <= 64; every step is exact in fp32).
// What is left is at most 2^-27 of the chunk's largest |x|, far below the
// rounding of an fp32 dot product (test bound: 1e-5 * sum|w*x|). The tensor cores
// then add integers, exactly; a block's int32 sums of a pair of terms are one
// exact float, scaled once by the block's E8M0 scale times the chunk's power of
// two into one fp32 sum per pair of terms.
//
// Shape of the work: a block of threads holds kTiles tiles of 16 rows, kWarps warps
// each (Layout: 4 x 4 by default, 4 x 2 and 8 x 2 for side-by-side runs); warp w of
// a tile takes the row's groups of 16 blocks (32 inputs each) q with q % kWarps == w,
// in ascending order, copying the next group into shared memory while it computes
// one (copy_group); the warps' sums are added in warp order.
//
// From two tokens on, one product a block and pair of tokens (one_product). A
// permute cannot give a negative byte (a selector's sign bit gives 0 or -1), so A
// holds w + 12 (0..24), positive codes from one table OR'd with negative codes
// from another, and the product's accumulator input C takes 12 * sum(q) back out
// and adds 1.5 * 2^23 (|sum(w q)| <= 32 * 12 * 64 < 2^22): D's bits are then the
// float 1.5 * 2^23 + sum(w q), made the exact float sum(w q) by one FADD, where I2F
// is a quarter-rate instruction on sm_90. At one token each block runs two
// products, positive codes and negative codes, and subtracts them: there the one
// product measured 0.92-0.99x of it on an H100 (2026-12-06), its C read adding 4
// shared-memory wavefronts a block to a kernel bound by them and by DRAM. In both,
// a lane's two columns (one token's terms k and k + 1, k = 0 or 2) become one
// integer 128 d_k + d_k+1 (below 2^22; C adds 1.5 * 2^23 to column k + 1 only, so
// one LEA and one FADD make it an exact float; two products: one I2F), scaled
// and added in the same order: a token's bits do not depend on the token count.
//
// The order of every sum depends on the row length and the layout only, never on the token
// count, the launch's other problems or the grid: grouped launches equal
// separate ones bit for bit. x is staged in shared memory for a whole row where
// it fits (kStageBytes) and in segments of whole groups otherwise; segments only
// cut each warp's ascending walk, so they change no bit either.
//
// Blocks whose E8M0 exponent is 253 or more (their weights can overflow to inf on
// the CPU) are left out of the tensor-core products and summed from ggml's own
// fp32 weights, so inf and NaN come out as the CPU's. A non-finite x makes its
// token's outputs NaN.
//
// What limited the first layout (ncu, 16384 x 32768 at one token): the staged x
// (66 KB) and 8 warps' copy buffers (76 KB) left one block, 8 warps, per SM: 4.4
// cycles per issued instruction with 2 warps a scheduler, DRAM 23 % busy. The
// 4 x 4 layout keeps 16 warps an SM (copy-buffer rows 68 words, not 76).
#include <cuda_pipeline.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "matvec_launch.cuh"
#include "quant_blocks.cuh"

namespace xpack::kernels::dev {
namespace {

// A block of threads is kTiles tiles of 16 rows sharing the staged x, kWarps warps
// a tile, warp w summing a row's groups of 16 blocks q with q % kWarps == w. Which
// layout runs is set_matvec_geometry's (MmaLayout below), the same for every launch,
// so grouped launches still equal separate ones bit for bit; kWarps orders the sums.
template <int kWarps, int kTiles>
struct Layout {
  static constexpr int kThreads = 32 * kWarps * kTiles;
  static_assert(kThreads <= 512, "a block's registers: 128 a thread at 512 threads");
};
constexpr int kTileRows = 16;
// Blocks (32-input chunks) of a row a warp copies and sums at once: a group.
constexpr int kGroup = 16;
// Staged x per block of threads, at most: 4.1 bytes an input and token, so a whole
// row of 35840 inputs at one token where the copy buffers leave room (two blocks of
// 8 warps an SM up to 8192 inputs); longer rows, and more tokens, are staged in
// segments of whole groups (again each time the block moves to new rows).
constexpr size_t kStageBytes = 144 * 1024;
constexpr int kBigExponent = 253;
// A's bytes, 12 + w for w = 2 * E2M1 (0, 1, 2, 3, 4, 6, 8, 12 by the code's low
// three bits): positive codes (kPos) and negative ones (kNeg: 12 - |w|).
constexpr uint32_t kPosLo = 0x0F0E0D0Cu, kPosHi = 0x18141210u;
constexpr uint32_t kNegLo = 0x090A0B0Cu, kNegHi = 0x00040608u;
constexpr int kOffset = 12;
// One token's form: |E2M1| * 2 by the code's low three bits (a sign bit gives 0).
constexpr uint32_t kTabLo = 0x03020100u, kTabHi = 0x0C080604u;
// 1.5 * 2^23: an int32 d with |d| < 2^22 added to its bits is the float 1.5 * 2^23 + d.
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;

// Bytes of staged x per 32-input chunk (NT is 1, 2, 4 or 8): a 256-byte B fragment
// for each pair of tokens (8 columns: 4 terms each), a token's 4 columns 128 bytes.
// Then each (chunk, token)'s power of two (the scale of q1, a float), then, from two
// tokens on, its C fragments: for terms 0 and 1, then 2 and 3, the pair's inputs
// twice (-12 * each term's sum over the chunk, plus kMagicBits for terms 1 and 3;
// int32), so one 16-byte read gives a lane its C.
__host__ __device__ constexpr int chunk_bytes(int nt) { return 128 * nt; }
__host__ __device__ constexpr int chunk_stage_bytes(int nt) { return chunk_bytes(nt) + 4 * nt + (nt > 1 ? 32 * nt : 0); }
// The staged x of seg chunks, rounded up to whole 16-byte pieces (the copy buffers follow).
template <int NT>
__host__ __device__ constexpr size_t x_stage_bytes(int seg) {
  return (size_t(seg) * chunk_stage_bytes(NT) + 15) / 16 * 16;
}

// 2^(e - 128) as a float for an E8M0 exponent 2 <= e < 255 (e * 2^23 - 2^23: its bits).
__device__ __forceinline__ float e8m0_scale_bits(uint32_t e) {
  uint32_t r;
  asm("mad.lo.u32 %0, %1, 8388608, -8388608;" : "=r"(r) : "r"(e));
  return __uint_as_float(r);
}

// D = A B + C with A 16x32 (row) and B 32x8 (col) int8, C and D int32; fragments as
// in the PTX ISA: lane (g = lane / 4, c = lane % 4) holds A rows g and g + 8 at
// k = 4c..4c+3 (a[0], a[1]) and 16 + 4c.. (a[2], a[3]), B column g at the same k
// (b[0], b[1]), and C and D rows g, g + 8 at columns 2c, 2c + 1.
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                       const int4& cf) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(cf.x), "r"(cf.y), "r"(cf.z),
        "r"(cf.w));
}

// Where chunk-local input i (code i of a block) sits in a B column: lane c's
// word holds code bytes 4c..4c+3, whose permutes give k = 4c.. the codes
// (4c, 4c+16, 4c+1, 4c+17) and k = 16 + 4c.. the codes (4c+2, 4c+18, 4c+3, 4c+19).
// Returns the byte offset within a column's 32 bytes laid out as [c][b0 b1].
__device__ __forceinline__ int b_offset(int i) {
  const int j = i & 15, hi = i >> 4, c = j >> 2, jb = j & 3;
  return c * 8 + (jb >> 1) * 4 + 2 * (jb & 1) + hi;
}

// One (chunk, token) of x, a lane's input xv each: its four int8 terms into piece
// (the token's 128 bytes of the chunk's B fragments), its power of two (the scale
// of q1) into *sc and, from two tokens on (!kOne), its C fragments into cf[0..7].
// In place where piece holds the floats: every lane reads its float before any
// byte is written.
template <bool kOne>
__device__ __forceinline__ void stage_item(float xv, int lane, uint8_t* piece, float* sc, int* cf) {
  const unsigned ex = chunk_exponent(xv);
  uint32_t q[4];
  int8_terms(xv, ex, q);
  __syncwarp();
  const int off = b_offset(lane);
#pragma unroll
  for (int j = 0; j < 4; ++j) piece[32 * j + off] = uint8_t(q[j]);
  if constexpr (kOne) {
    if (lane == 0) *sc = term_unit<7>(ex);  // 128 d_k + d_k+1 is in units of 2^-7 d_k
  } else {
    int cin[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      cin[j] = (j & 1 ? kMagicBits : 0) - kOffset * __reduce_add_sync(0xFFFFFFFFu, int(int8_t(q[j])));
    if (lane == 0) {
      *sc = term_unit<7>(ex);
      int4* f = reinterpret_cast<int4*>(cf);
      f[0] = make_int4(cin[0], cin[1], cin[0], cin[1]);
      f[1] = make_int4(cin[2], cin[3], cin[2], cin[3]);
    }
  }
}

// Stages chunks [c0, c0 + nc) of every token's x: the four int8 terms into the B
// fragments, each chunk's power of two into xsc[chunk][t], and the C fragments
// into xc[chunk][t][8].
// A token's 32 floats of a chunk take the 128 bytes its B columns will: they are
// copied in all at once (cp.async: one round trip, where a load per chunk and
// warp had cost 16 us of a 20 us product), then each warp turns its (chunk,
// token) pieces into terms in place.
template <int NT, int kThreads>
__device__ void stage_x(const float* x, size_t ne0, int row0, int nt_real, int c0, int nc, uint8_t* bsm,
                        float* xsc, int* xc) {
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  constexpr int kPieces = 8 * NT;  // 16-byte pieces of a chunk
  for (int i = int(threadIdx.x); i < nc * kPieces; i += kThreads) {
    const int ch = i / kPieces, rem = i - ch * kPieces, t = rem >> 3, k = rem & 7;
    const float* src = x + size_t(row0 + min(t, nt_real - 1)) * ne0 + size_t(c0 + ch) * 32 + 4 * k;
    __pipeline_memcpy_async(bsm + size_t(ch) * chunk_bytes(NT) + t * 128 + 16 * k, src, 16);
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  for (int item = warp; item < nc * NT; item += kThreads / 32) {
    const int ch = item / NT, t = item - ch * NT;
    uint8_t* piece = bsm + size_t(ch) * chunk_bytes(NT) + t * 128;
    stage_item<NT == 1>(reinterpret_cast<const float*>(piece)[lane], lane, piece, xsc + ch * NT + t,
                        xc + (ch * NT + t) * 8);
  }
  __syncthreads();
}

// x staged once for the whole launch (stage_launch_kernel): problem p's (products of
// one input: one) at p * x_stage_bytes<NT>(units), laid out as stage_x lays out a
// whole row, so a segment is three copies. At eight tokens x is restaged for each
// set of 64 rows (16 KB a 1.3 KB chunk: a row of 16384 inputs in four segments),
// and making the terms cost each block about as many instructions as its products
// (SASS, 2026-12-06).
template <int NT>
__global__ void __launch_bounds__(256) stage_launch_kernel(const GroupParams gp, int ne0, const float* __restrict__ x,
                                                           uint8_t* __restrict__ out) {
  const int p = blockIdx.y, lane = int(threadIdx.x & 31);
  const int units = ne0 / 32;
  uint8_t* bsm = out + size_t(p) * x_stage_bytes<NT>(units);
  float* xsc = reinterpret_cast<float*>(bsm + size_t(units) * chunk_bytes(NT));
  int* xc = reinterpret_cast<int*>(xsc + size_t(units) * NT);
  const int nt_real = gp.ntok[p], row0 = gp.row[p];
  if (nt_real <= 0) return;  // a problem without tokens reads no x
  for (int item = int(blockIdx.x * 8 + (threadIdx.x >> 5)); item < units * NT; item += int(gridDim.x) * 8) {
    const int ch = item / NT, t = item - ch * NT;
    const float xv = __ldg(x + size_t(row0 + min(t, nt_real - 1)) * size_t(ne0) + size_t(ch) * 32 + lane);
    stage_item<NT == 1>(xv, lane, bsm + size_t(ch) * chunk_bytes(NT) + t * 128, xsc + ch * NT + t,
                        xc + (ch * NT + t) * 8);
  }
}

// Groups q0, q0 + qs, ... (n of them, kGroup chunks each) of a launch's staged x
// (pre: its problem's) into the block's, one after another: a range of chunks
// (qs = 1), or a sliced block's groups (mxfp4_mmv_kernel).
// kStrided false: qs is 1, one range (the unsliced kernel's; no division a piece).
template <int NT, int kThreads, bool kStrided>
__device__ void copy_staged(const uint8_t* pre, int units, int q0, int qs, int n, uint8_t* bsm, float* xsc, int* xc) {
  const uint8_t* src[3] = {pre, pre + size_t(units) * chunk_bytes(NT),
                           pre + size_t(units) * (chunk_bytes(NT) + 4 * NT)};
  uint8_t* dst[3] = {bsm, reinterpret_cast<uint8_t*>(xsc), reinterpret_cast<uint8_t*>(xc)};
  constexpr int kChunkBytes[3] = {chunk_bytes(NT), 4 * NT, NT > 1 ? 32 * NT : 0};
#pragma unroll
  for (int r = 0; r < 3; ++r) {
    const int group_bytes = kGroup * kChunkBytes[r], per_group = group_bytes / 16;
    if constexpr (!kStrided) {
      for (int i = int(threadIdx.x); i < n * per_group; i += kThreads)
        __pipeline_memcpy_async(dst[r] + 16 * i, src[r] + size_t(q0) * group_bytes + 16 * size_t(i), 16);
    } else {
      for (int i = int(threadIdx.x); i < n * per_group; i += kThreads) {
        const int k = i / per_group, piece = i - k * per_group;
        __pipeline_memcpy_async(dst[r] + size_t(k) * group_bytes + 16 * piece,
                                src[r] + size_t(q0 + k * qs) * group_bytes + 16 * piece, 16);
      }
    }
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
}

// The weights reach the fragments through shared memory. Loaded by each fragment's
// own lanes (4 bytes of a row's block each, 8 rows an instruction), they cost 8 L1
// wavefronts per 128 bytes and ran at 21 % of the copy bandwidth (H200,
// 2026-12-03). Here a warp copies a group of 16 blocks of its 16 rows, 272
// contiguous bytes a row, with 16-byte cp.async (consecutive lanes, consecutive
// pieces of a row), into a copy buffer of rows kRowWords apart, while it computes the
// group before; the fragments are then 4-byte reads at constant offsets. Rows
// are 272 * (units / 16) bytes, so the path needs units % 16 == 0 (ne0 % 512:
// every real model's shapes) and 16-byte aligned weights.
constexpr int kGroupBytes = 17 * kGroup;  // 272
constexpr int kPieces = kGroupBytes / 16;  // 17 pieces of 16 bytes a row
// Words between rows in a copy buffer: 68, a group exactly. The 8 rows one fragment
// read touches fall in different banks (68 * d mod 32 = 4 d for 0 < d < 8, so the
// lanes' +c words, c < 4, cannot meet; 76 had the same property and cost 8 KB more
// a block of 8 warps).
constexpr int kRowWords = 68;
constexpr int kBufWords = kTileRows * kRowWords;
constexpr int kBufBytes = 4 * kBufWords;

// Copies group q of the tile's 16 rows (rows past ne1 repeat its last) into buf.
__device__ __forceinline__ void copy_group(const uint8_t* W, size_t row_bytes, int o0, int ne1, int q, int lane,
                                           uint32_t* buf) {
#pragma unroll
  for (int j = 0; j < (kTileRows * kPieces + 31) / 32; ++j) {
    const int k = lane + 32 * j;
    if (k < kTileRows * kPieces) {
      const int r = k / kPieces, piece = k - r * kPieces;
      const uint8_t* src = W + size_t(min(o0 + r, ne1 - 1)) * row_bytes + size_t(q) * kGroupBytes + 16 * piece;
      __pipeline_memcpy_async(buf + r * kRowWords + 4 * piece, src, 16);
    }
  }
  __pipeline_commit();
}

template <int NT>
struct Tile {
  static constexpr int kNtiles = (NT + 1) / 2;
  // Per pair of tokens, rows g and g + 8: this lane's 128 d_k + d_k+1, scaled and
  // summed over blocks.
  float acc[kNtiles][2];
  bool any_big;
};

// The x a block's products read: every token's row (rows past the launch's tokens
// repeat its last), for the rare blocks summed one weight at a time.
struct XRows {
  const float* x;
  int ne0, row0, nt_real;
};

// Block u's rows with kBigExponent (biga: row g, bigb: row g + 8), from ggml's own
// weights one by one into big (this lane's codes 4c.. and 16 + 4c..). A function of
// its own, never inlined: inlined, the compiler formed this path's 64-bit addresses
// (the block in each row, x's rows) in some blocks before the branch that skips
// them, and the path's copies made the kernel's code 1.8x as large (SASS, 2026-12-03).
template <int NT>
__device__ __noinline__ void big_block(float (&big)[2][NT], const uint8_t* rowa, const uint8_t* rowb, bool biga,
                                       bool bigb, int u, int c, XRows xr) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!(r == 0 ? biga : bigb)) continue;
    const uint8_t* blk = (r == 0 ? rowa : rowb) + size_t(u) * 17;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = 4 * c + (j & 3) + 16 * (j >> 2);
      const float w = dequant_elem<39>(blk, i);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xt = xr.x + size_t(xr.row0 + min(t, xr.nt_real - 1)) * size_t(xr.ne0);
        big[r][t] = fmaf(w, __ldg(xt + size_t(u) * 32 + i), big[r][t]);
      }
    }
  }
}

// This lane's B fragment of pair nt of a staged chunk (one token fills columns
// 0..3 only: lanes 16.. give 0).
template <int NT>
__device__ __forceinline__ uint2 b_fragment(const uint8_t* bchunk, int nt, int lane) {
  if (NT > 1 || lane < 16) return *reinterpret_cast<const uint2*>(bchunk + nt * 256 + lane * 8);
  return make_uint2(0, 0);
}

// The E8M0 scales sa, sb of block u of rows a and b. Rare blocks: subnormal scales,
// and weights that may overflow (kBigExponent), whose rows leave_out takes out of
// the product (left out, a row's D is 0, and its scale 0: an inf one would make
// 0 * inf NaN) and big_block sums weight by weight.
template <int NT, class LeaveOut>
__device__ __forceinline__ void block_scales(Tile<NT>& tl, float (&big)[2][NT], uint32_t ea, uint32_t eb, float& sa,
                                             float& sb, const uint8_t* rowa, const uint8_t* rowb, int u, int c,
                                             const XRows& xr, LeaveOut&& leave_out) {
  const bool biga = ea >= kBigExponent, bigb = eb >= kBigExponent;
  // 2^(e - 128) for 2 <= e < 253: e * 2^23 - 2^23 as a float's bits, one IMAD (in
  // C++, any spelling of it compiled to three: shift, mask, add).
  sa = e8m0_scale_bits(ea);
  sb = e8m0_scale_bits(eb);
  if (ea - 2u > 250u || eb - 2u > 250u) {
    if (ea - 2u > 250u) sa = biga ? 0.0f : e8m0_half(ea);
    if (eb - 2u > 250u) sb = bigb ? 0.0f : e8m0_half(eb);
    if (biga || bigb) {
      tl.any_big = true;
      leave_out(biga, bigb);
      big_block<NT>(big, rowa, rowb, biga, bigb, u, c, xr);
    }
  }
}

// Block u of rows a (g) and b (g + 8), the form of one token (and, so switched,
// of more): two products per pair of tokens, positive codes and negative codes (a
// permute of the nibble as its own selector gives 0 where the selector's sign bit
// is set), subtracted, a lane's two terms one integer made a float.
template <int NT>
__device__ __forceinline__ void two_products(Tile<NT>& tl, float (&big)[2][NT], uint32_t wa, uint32_t wb,
                                             uint32_t ea, uint32_t eb, uint32_t tab, const uint8_t* rowa,
                                             const uint8_t* rowb, int u, int lane, const uint8_t* bchunk,
                                             const float* xs, const XRows& xr) {
  const int c = lane & 3;
  const uint32_t na = wa ^ 0x88888888u, nb = wb ^ 0x88888888u;
  uint32_t pos[4] = {prmt(tab, kTabHi, wa), prmt(tab, kTabHi, wb), prmt(tab, kTabHi, wa >> 16),
                     prmt(tab, kTabHi, wb >> 16)};
  uint32_t neg[4] = {prmt(tab, kTabHi, na), prmt(tab, kTabHi, nb), prmt(tab, kTabHi, na >> 16),
                     prmt(tab, kTabHi, nb >> 16)};
  float sa, sb;
  block_scales<NT>(tl, big, ea, eb, sa, sb, rowa, rowb, u, c, xr, [&](bool biga, bool bigb) {
    if (biga) pos[0] = pos[2] = neg[0] = neg[2] = 0;
    if (bigb) pos[1] = pos[3] = neg[1] = neg[3] = 0;
  });
#pragma unroll
  for (int nt = 0; nt < Tile<NT>::kNtiles; ++nt) {
    const uint2 b = b_fragment<NT>(bchunk, nt, lane);
    int dp[4], dn[4];
    mma_s8(dp, pos, b.x, b.y);
    mma_s8(dn, neg, b.x, b.y);
    const int tok = min(2 * nt + (c >> 1), NT - 1);
    const float xsv = xs[tok];
    const float fa = __fmul_rn(sa, xsv), fb = __fmul_rn(sb, xsv);
    tl.acc[nt][0] = fmaf(fa, float((dp[0] - dn[0]) * 128 + (dp[1] - dn[1])), tl.acc[nt][0]);
    tl.acc[nt][1] = fmaf(fb, float((dp[2] - dn[2]) * 128 + (dp[3] - dn[3])), tl.acc[nt][1]);
  }
}

// Block u of rows a (g) and b (g + 8): one tensor-core product per pair of tokens,
// then a lane's two terms one exact float, scaled into the fp32 sums: the same floats
// as two_products' and the same operations on them, so the same bits.
template <int NT>
__device__ __forceinline__ void one_product(Tile<NT>& tl, float (&big)[2][NT], uint32_t wa, uint32_t wb,
                                            uint32_t ea, uint32_t eb, const uint32_t (&tab)[4],
                                            const uint8_t* rowa, const uint8_t* rowb, int u, int lane,
                                            const uint8_t* bchunk, const float* xs, const int* xc,
                                            const XRows& xr) {
  const int c = lane & 3;
  // Negative codes' selectors with their sign bit clear (and positive ones' set), so
  // each permute gives 0 where the other gives the byte.
  const uint32_t na = wa ^ 0x88888888u, nb = wb ^ 0x88888888u;
  uint32_t a[4] = {prmt(tab[0], tab[1], wa) | prmt(tab[2], tab[3], na),
                   prmt(tab[0], tab[1], wb) | prmt(tab[2], tab[3], nb),
                   prmt(tab[0], tab[1], wa >> 16) | prmt(tab[2], tab[3], na >> 16),
                   prmt(tab[0], tab[1], wb >> 16) | prmt(tab[2], tab[3], nb >> 16)};
  float sa, sb;
  block_scales<NT>(tl, big, ea, eb, sa, sb, rowa, rowb, u, c, xr, [&](bool biga, bool bigb) {
    constexpr uint32_t kZero = 0x01010101u * kOffset;  // w = 0
    if (biga) a[0] = a[2] = kZero;
    if (bigb) a[1] = a[3] = kZero;
  });
#pragma unroll
  for (int nt = 0; nt < Tile<NT>::kNtiles; ++nt) {
    const uint2 b = b_fragment<NT>(bchunk, nt, lane);
    const int tok = min(2 * nt + (c >> 1), NT - 1);
    const int4 cf = *reinterpret_cast<const int4*>(xc + tok * 8 + 4 * (c & 1));
    int d[4];
    mma_s8(d, a, b.x, b.y, cf);
    const float xsv = xs[tok];
    const float fa = __fmul_rn(sa, xsv), fb = __fmul_rn(sb, xsv);
    tl.acc[nt][0] = fmaf(fa, __int_as_float(d[0] * 128 + d[1]) - kMagic, tl.acc[nt][0]);
    tl.acc[nt][1] = fmaf(fb, __int_as_float(d[2] * 128 + d[3]) - kMagic, tl.acc[nt][1]);
  }
}

// At most 128 registers a thread at any layout (two blocks of 256 threads an SM, or one of 512).
// kOne: one product a block and pair of tokens (one_product; from two tokens on),
// else two (two_products).
//
// kSliced: the same sums, another assignment of the work. A block of the layout's
// threads takes kWarps * kTiles tiles, one a warp, and one k-split w of them (w =
// blockIdx.x % kWarps: the groups q % kWarps == w), staging only those groups of x;
// each warp writes the sums the unsliced block puts in red to `part`, and
// slice_sum_kernel adds a row's kWarps of them in warp order, as the unsliced block
// does. So a launch may take either by its own measure: the bits are the same. Why:
// from two tokens on, x staged is 41 bytes an input and token (four int8 terms and
// the C fragments), 1.2x a tile of 16 rows' weights a token; an unsliced block reads
// all of it for its kTiles tiles, a sliced one a kWarps-th for kWarps * kTiles tiles.
// x must be staged once for the launch (pre).
template <int NT, int kWarps, int kTiles, bool kOne, bool kSliced>
__global__ void __launch_bounds__(Layout<kWarps, kTiles>::kThreads, 512 / Layout<kWarps, kTiles>::kThreads)
    mxfp4_mmv_kernel(const GroupParams gp, int ne0, int ne1, size_t row_bytes, const float* __restrict__ x,
                     float* __restrict__ y, int seg_chunks, const uint8_t* __restrict__ pre, float* __restrict__ part) {
  constexpr int kThreads = Layout<kWarps, kTiles>::kThreads;
  constexpr int kBlockTiles = kSliced ? kWarps * kTiles : kTiles;
  extern __shared__ __align__(16) uint8_t stage[];
  __shared__ float red[kSliced ? 1 : kTiles][kWarps][kTileRows][NT];
  const int p = blockIdx.y;
  const uint8_t* W = gp.w[p];
  const int row0 = gp.row[p];
  const int nt_real = gp.ntok[p];
  const int lane = int(threadIdx.x & 31);
  // This warp's tile in the block's set and its k-split.
  const int sub = kSliced ? int(threadIdx.x >> 5) : int(threadIdx.x >> 5) / kWarps;
  const int warp = kSliced ? int(blockIdx.x % kWarps) : int(threadIdx.x >> 5) % kWarps;
  const int g = lane >> 2, c = lane & 3;
  const int units = ne0 / 32;
  // The permutes' table in one register: as a constant (or any value it can tell
  // is the warp's), the compiler copied it from a uniform register before each
  // permute, eight moves a block.
  uint32_t lane_id;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane_id));
  const uint32_t zero = lane_id >> 5;
  static_assert(NT > 1 || !kOne, "one token takes two products");
  const uint32_t tab[4] = {(kOne ? kPosLo : kTabLo) + zero, kPosHi + zero, kNegLo + zero, kNegHi + zero};
  uint8_t* bsm = stage;
  float* xsc = reinterpret_cast<float*>(stage + size_t(seg_chunks) * chunk_bytes(NT));
  int* xc = reinterpret_cast<int*>(xsc + size_t(seg_chunks) * NT);
  // This warp's two copy buffers (the group it computes, the group it copies), after x.
  uint32_t* bufs = reinterpret_cast<uint32_t*>(stage + x_stage_bytes<NT>(seg_chunks)) +
                    size_t(threadIdx.x >> 5) * 2 * kBufWords;

  const XRows xr{x, ne0, row0, nt_real};

  if (pre) pre += size_t(gp.shared ? 0 : p) * x_stage_bytes<NT>(units);
  // The groups the block stages, l = 0, 1, ...: group qbase + qs * l of the row.
  const int groups = units / kGroup;
  const int qs = kSliced ? kWarps : 1, qbase = kSliced ? warp : 0;
  const int staged = kSliced ? (groups > warp ? (groups - warp + kWarps - 1) / kWarps : 0) : groups;
  const int seg_groups = seg_chunks / kGroup;
  // Staged groups [l0, l0 + nl) into the block's stage: made here, or copied where
  // the launch made them once (the same bytes).
  auto load_x = [&](int l0, int nl) {
    if (kSliced || pre) copy_staged<NT, kThreads, kSliced>(pre, units, qbase + qs * l0, qs, nl, bsm, xsc, xc);
    else stage_x<NT, kThreads>(x, size_t(ne0), row0, nt_real, l0 * kGroup, nl * kGroup, bsm, xsc, xc);
  };
  const bool whole = seg_groups >= staged;
  if (whole) load_x(0, staged);

  int tiles = (ne1 + kTileRows - 1) / kTileRows;
  if (gp.shared) tiles = shared_groups(gp, kTileRows);
  // Every warp walks the same sets of kBlockTiles tiles (the staging's barriers); a
  // warp whose tile is past the last computes nothing.
  const int set0 = kSliced ? int(blockIdx.x / kWarps) : int(blockIdx.x);
  const int sets_step = kSliced ? int(gridDim.x / kWarps) : int(gridDim.x);
  for (int set = set0; set * kBlockTiles < tiles; set += sets_step) {
    const int tile = set * kBlockTiles + sub;
    const bool live = tile < tiles;
    int tl_index = live ? tile : tiles - 1;
    if (gp.shared) {  // the tile's product: products' tiles one after another
      const int q = shared_product(gp, kTileRows, tl_index);
      W = gp.w[q];
      ne1 = gp.ne1[q];
      y = gp.y[q];
    }
    const int o0 = tl_index * kTileRows;
    const uint8_t* rowa = W + size_t(min(o0 + g, ne1 - 1)) * row_bytes;
    const uint8_t* rowb = W + size_t(min(o0 + g + 8, ne1 - 1)) * row_bytes;

    Tile<NT> tl;
#pragma unroll
    for (int i = 0; i < Tile<NT>::kNtiles; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) tl.acc[i][j] = 0.0f;
    float big[2][NT];  // this lane's codes of blocks with kBigExponent, rows g and g + 8
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) big[r][t] = 0.0f;
    tl.any_big = false;

    for (int l0 = 0; l0 < staged; l0 += seg_groups) {
      const int nl = min(seg_groups, staged - l0);
      if (!whole) {
        __syncthreads();  // the previous segment's readers are done
        load_x(l0, nl);
      }
      // This warp's groups of the segment: q = warp, warp + kWarps, ... in
      // ascending order (segments hold whole groups); sliced, every staged one.
      const int lstep = kSliced ? 1 : kWarps;
      const int first = kSliced ? l0 : l0 + ((warp - l0) % kWarps + kWarps) % kWarps;
      const int mine = live && first < l0 + nl ? (l0 + nl - first + lstep - 1) / lstep : 0;
      if (mine > 0) copy_group(W, row_bytes, o0, ne1, qbase + qs * first, lane, bufs);
      for (int i = 0; i < mine; ++i) {
        const int l = first + lstep * i;  // the group's place among the staged
        const int q = qbase + qs * l;
        const int c0 = (q - l + l0) * kGroup;  // u - c0: block u's chunk in the stage
        uint32_t* cur = bufs + (i & 1) * kBufWords;
        if (i + 1 < mine) copy_group(W, row_bytes, o0, ne1, q + kWarps, lane, bufs + ((i + 1) & 1) * kBufWords);
        else __pipeline_commit();  // an empty group: wait_prior(1) below then means this one
        __pipeline_wait_prior(1);
        __syncwarp();  // every lane's pieces are in
        const uint32_t* ra = cur + g * kRowWords;
        const uint32_t* rb = ra + 8 * kRowWords;
        const uint8_t* rab = reinterpret_cast<const uint8_t*>(ra);
        const uint8_t* rbb = reinterpret_cast<const uint8_t*>(rb);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          // Block j's code bytes 4c..4c+3 start at byte 17 j + 1 + 4 c of the row.
          const int at = 17 * j + 1;
          const int w = (at >> 2) + c;
          const unsigned sh = 8u * unsigned(at & 3);
          const uint32_t wa = sh ? __funnelshift_r(ra[w], ra[w + 1], sh) : ra[w];
          const uint32_t wb = sh ? __funnelshift_r(rb[w], rb[w + 1], sh) : rb[w];
          const int u = q * kGroup + j;
          const uint8_t* bchunk = bsm + size_t(u - c0) * chunk_bytes(NT);
          if constexpr (kOne)
            one_product<NT>(tl, big, wa, wb, rab[17 * j], rbb[17 * j], tab, rowa, rowb, u, lane, bchunk,
                            xsc + (u - c0) * NT, xc + (u - c0) * NT * 8, xr);
          else
            two_products<NT>(tl, big, wa, wb, rab[17 * j], rbb[17 * j], tab[0], rowa, rowb, u, lane, bchunk,
                             xsc + (u - c0) * NT, xr);
        }
        __syncwarp();  // done with cur before a later copy overwrites it
      }
    }

    // Terms to sums: lane c holds columns 2c, 2c + 1, i.e. terms (0, 1) for even c
    // and (2, 3) for odd c of token 2 * pair + c / 2; its partner c ^ 1 the others.
    const float w = (c & 1) ? 0x1p-14f : 1.0f;  // terms 2 and 3 weigh 2^-14 of 0 and 1
    const bool any_big = __any_sync(0xFFFFFFFFu, tl.any_big);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float bq[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        bq[t] = big[r][t];
        if (any_big) {
          bq[t] += __shfl_xor_sync(0xFFFFFFFFu, bq[t], 1);
          bq[t] += __shfl_xor_sync(0xFFFFFFFFu, bq[t], 2);
        }
      }
#pragma unroll
      for (int nt = 0; nt < Tile<NT>::kNtiles; ++nt) {
        float v = tl.acc[nt][r] * w;
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
        const int tok = 2 * nt + (c >> 1);
        if ((c & 1) == 0 && tok < NT) {
          float tot = v;
#pragma unroll
          for (int t = 0; t < NT; ++t)
            if (t == tok && any_big) tot += bq[t];
          if constexpr (kSliced) {
            if (live)
              part[((size_t(gp.shared ? 0 : p) * kWarps + warp) * size_t(tiles) + size_t(tile)) * (kTileRows * NT) +
                   size_t(g + 8 * r) * NT + size_t(tok)] = tot;
          } else {
            red[sub][warp][g + 8 * r][tok] = tot;
          }
        }
      }
    }
    if constexpr (kSliced) continue;  // slice_sum_kernel writes y
    __syncthreads();
    for (int i = int(threadIdx.x) - sub * 32 * kWarps; i >= 0 && i < kTileRows * NT; i += 32 * kWarps) {
      const int r = i / NT, t = i - r * NT;
      const int o = o0 + r;
      if (live && o < ne1 && t < nt_real) {
        float s = red[sub][0][r][t];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) s += red[sub][w][r][t];
        y[size_t(row0 + t) * size_t(ne1) + o] = s;
      }
    }
    __syncthreads();  // red is reused by the next tile
  }
}

// y of a sliced launch (mxfp4_mmv_kernel): each row and token's kWarps sums added
// in warp order, as the unsliced block adds its warps'.
template <int NT, int kWarps>
__global__ void __launch_bounds__(256) slice_sum_kernel(const GroupParams gp, int ne1, float* __restrict__ y,
                                                        const float* __restrict__ part, int tiles) {
  const int p = blockIdx.y;  // 0 for products of one input
  const int row0 = gp.row[p], nt_real = gp.ntok[p];
  const size_t per = size_t(tiles) * (kTileRows * NT);  // one warp's sums of every tile
  const float* src = part + size_t(p) * kWarps * per;
  for (size_t i = size_t(blockIdx.x) * 256 + threadIdx.x; i < per; i += size_t(gridDim.x) * 256) {
    const int t = int(i % NT);
    const size_t rt = i / NT;
    int tile = int(rt / kTileRows);
    const int r = int(rt % kTileRows);
    float* yp = y;
    int n1 = ne1;
    if (gp.shared) {
      const int q = shared_product(gp, kTileRows, tile);
      yp = gp.y[q];
      n1 = gp.ne1[q];
    }
    const int o = tile * kTileRows + r;
    if (o >= n1 || t >= nt_real) continue;
    float sum = src[i];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += src[size_t(w) * per + i];
    yp[size_t(row0 + t) * size_t(n1) + o] = sum;
  }
}

// The kernel's launch setup, once per kernel: whether its shared memory could be
// raised to `smem_max`, and its blocks per SM at a size.
template <class K>
struct KernelSetup {
  K* kernel;
  bool attr_ok;
  OccupancyCache occ;
  KernelSetup(K* k, size_t smem_max)
      : kernel(k),
        attr_ok(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_max)) == cudaSuccess) {}
  int per_sm(int threads, size_t smem) { return attr_ok ? occ.blocks(kernel, threads, smem) : 0; }
};

// Where a sliced launch is built: the layouts that have few tiles' blocks, from
// two tokens on with one product (and at one token): the others take the unsliced.
template <int NT, int kWarps, int kTiles, bool kOne>
constexpr bool kSliceable = (kWarps * kTiles == 16) && (kWarps == 4 || kWarps == 16) && (NT == 1 || kOne);

constexpr int kSliceMinInputs = 7168;

template <int NT, int kWarps, int kTiles, bool kOne>
cudaError_t launch_nt(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y, bool shared_wave,
                      const MmaOptions& st, cudaStream_t stream) {
  constexpr int kThreads = Layout<kWarps, kTiles>::kThreads;
  constexpr size_t kBufs = size_t(kThreads / 32) * 2 * kBufBytes;
  constexpr size_t kRed = sizeof(float) * kTiles * kWarps * kTileRows * NT;  // the kernel's static array
  // Chunks of x a block stages at once: kStageBytes, or what the device's shared
  // memory leaves beside the copy buffers (16 warps' take 139 KB), in whole groups.
  static const int max_chunks = [] {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      return 0;
    const long long room = std::min<long long>(kStageBytes, (long long)optin - (long long)(kBufs + kRed) - 16);
    return room <= 0 ? 0 : int(room / chunk_stage_bytes(NT)) / kGroup * kGroup;
  }();
  if (max_chunks < kGroup) return cudaErrorNotSupported;
  const size_t smem_max = x_stage_bytes<NT>(max_chunks) + kBufs;
  static KernelSetup plain(mxfp4_mmv_kernel<NT, kWarps, kTiles, kOne, false>, smem_max);
  const int units = ne0 / 32;
  const int sms = sm_count();
  long long tiles = (ne1 + kTileRows - 1) / kTileRows;
  if (gp.shared) tiles = shared_groups(gp, kTileRows);
  const int probs = gp.shared ? 1 : gp.n;
  // x made once for the launch, where the scratch holds it: by default from two
  // tokens on, and at one token for rows of kPrestageMinInputs and more. At one
  // token a block stages a row of up to 35840 inputs once for all its tiles, which
  // still pays where a block has few tiles for it: made once, rows of 12288-33792
  // inputs took 1.03-1.14x less time, those of 3584-7168 0.95-1.02x (H100, replayed,
  // 2026-12-06, bench-kernels --prestage against the default, doc/kernels.md).
  const size_t need = size_t(probs) * x_stage_bytes<NT>(units);
  const bool fits = st.buf && need <= st.bytes;
  // Sliced (the same bits): where x may be made once and the scratch holds the
  // warps' sums after it; by default (kSwitchAuto) from two tokens on, for rows of
  // kSliceMinInputs and more or a launch of several problems. Measured on an H100
  // (2026-12-07, bench-kernels --no-mma-slices against the default, doc/kernels.md):
  // at 2-8 tokens 4 x 4 took 1.01-1.38x less time sliced on rows of 7168-33792
  // inputs, 16 x 1 1.09-2.6x; on rows of 3584-6144 inputs 0.86-1.05x and
  // 0.78-1.74x; at one token 0.86-1.07x and 0.67-1.26x. A grouped launch of 48
  // DeepSeek-V4 experts (4096 inputs) at one token took 1.79x less time sliced in 16 x 1.
  const size_t part_at = (need + 255) / 256 * 256;
  const size_t part_bytes = size_t(probs) * kWarps * size_t(tiles) * kTileRows * NT * sizeof(float);
  bool sliced = false;
  int seg = std::min(units, max_chunks), per_sm = 0;
  if constexpr (kSliceable<NT, kWarps, kTiles, kOne>) {
    static KernelSetup cut(mxfp4_mmv_kernel<NT, kWarps, kTiles, kOne, true>, smem_max);
    const bool pays = NT >= 2 && (ne0 >= kSliceMinInputs || gp.n > 1);
    if (fits && (st.slices == kSwitchOn || (st.slices == kSwitchAuto && pays)) && st.prestage != kPrestageNever &&
        part_at + part_bytes <= st.bytes) {
      const int sliced_seg = std::min((units / kGroup + kWarps - 1) / kWarps * kGroup, max_chunks);
      per_sm = cut.per_sm(kThreads, x_stage_bytes<NT>(sliced_seg) + kBufs);
      sliced = per_sm > 0;
      if (sliced) seg = sliced_seg;
    }
  }
  if (!sliced) per_sm = plain.per_sm(kThreads, x_stage_bytes<NT>(seg) + kBufs);
  if (per_sm <= 0 || sms <= 0) return cudaErrorNotSupported;
  const size_t smem = x_stage_bytes<NT>(seg) + kBufs;
  const long long wave = shared_wave ? std::max(1, sms * per_sm / probs) : sms * per_sm;
  const uint8_t* pre = nullptr;
  if (fits && (sliced || st.prestage == kPrestageAlways || (st.prestage == kPrestageAuto && prestage_pays(NT, ne0)))) {
    const long long items = (long long)units * NT;
    const unsigned bx = unsigned(std::min<long long>((items + 7) / 8, (long long)sms * 8));
    stage_launch_kernel<NT><<<dim3(bx, unsigned(probs)), 256, 0, stream>>>(gp, ne0, x, st.buf);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    pre = st.buf;
  }
  if constexpr (kSliceable<NT, kWarps, kTiles, kOne>) {
    if (sliced) {
      // Each set of kWarps * kTiles tiles as kWarps blocks, one a k-split.
      const long long sets = (tiles + kWarps * kTiles - 1) / (kWarps * kTiles);
      const long long blocks = std::min(sets, std::max<long long>(1, wave / kWarps)) * kWarps;
      float* part = reinterpret_cast<float*>(st.buf + part_at);
      mxfp4_mmv_kernel<NT, kWarps, kTiles, kOne, true>
          <<<dim3(unsigned(blocks), unsigned(probs)), kThreads, smem, stream>>>(gp, ne0, ne1, rb, x, y, seg, pre,
                                                                                part);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      const long long per = tiles * kTileRows * NT;
      const unsigned bx = unsigned(std::min<long long>((per + 255) / 256, (long long)sms * 8));
      slice_sum_kernel<NT, kWarps><<<dim3(bx, unsigned(probs)), 256, 0, stream>>>(gp, ne1, y, part, int(tiles));
      return cudaGetLastError();
    }
  }
  const long long sets = (tiles + kTiles - 1) / kTiles;
  mxfp4_mmv_kernel<NT, kWarps, kTiles, kOne, false>
      <<<dim3(unsigned(std::min(sets, wave)), unsigned(probs)), kThreads, smem, stream>>>(gp, ne0, ne1, rb, x, y, seg,
                                                                                          pre, nullptr);
  return cudaGetLastError();
}

template <int kWarps, int kTiles>
cudaError_t launch_layout(const GroupParams& gp, int ne0, int ne1, size_t rb, const float* x, float* y, int nt_max,
                          bool shared_wave, const MmaOptions& st, cudaStream_t stream) {
  if (nt_max <= 1) return launch_nt<1, kWarps, kTiles, false>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
  if (st.one_product) {
    if (nt_max <= 2) return launch_nt<2, kWarps, kTiles, true>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
    if (nt_max <= 4) return launch_nt<4, kWarps, kTiles, true>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
    return launch_nt<8, kWarps, kTiles, true>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
  }
  if (nt_max <= 2) return launch_nt<2, kWarps, kTiles, false>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
  if (nt_max <= 4) return launch_nt<4, kWarps, kTiles, false>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
  return launch_nt<8, kWarps, kTiles, false>(gp, ne0, ne1, rb, x, y, shared_wave, st, stream);
}

}  // namespace

cudaError_t launch_mxfp4_mmv(const GroupParams& gp, int ne0, int ne1, size_t row_bytes, const float* x, float* y,
                             int nt_max, MmaLayout layout, bool shared_wave, const MmaOptions& st,
                             cudaStream_t stream) {
  // Whole groups of 16 blocks a row (rows 16-byte aligned, as the copies need).
  if (ne0 % (32 * kGroup) != 0) return cudaErrorNotSupported;
  switch (layout) {
    case MmaLayout::k4x4: return launch_layout<4, 4>(gp, ne0, ne1, row_bytes, x, y, nt_max, shared_wave, st, stream);
    case MmaLayout::k8x2: return launch_layout<8, 2>(gp, ne0, ne1, row_bytes, x, y, nt_max, shared_wave, st, stream);
    // One tile a block, its row split over 16 warps: four times the 4 x 4 layout's blocks
    // for matrices of few tiles (4096 rows: 256 tiles, 48 % of a round of 132 SMs x 4).
    case MmaLayout::k16x1: return launch_layout<16, 1>(gp, ne0, ne1, row_bytes, x, y, nt_max, shared_wave, st, stream);
    default: return launch_layout<4, 2>(gp, ne0, ne1, row_bytes, x, y, nt_max, shared_wave, st, stream);
  }
}

}  // namespace xpack::kernels::dev
