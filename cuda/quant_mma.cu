// The tensor-core prefill of quant_mma.h: bf16 mma.sync over weights decoded into
// shared memory and activations split into three exact bf16 terms (once per launch,
// into the workspace, by split_kernel: every row tile of a product used to split the
// same activations again, about as much integer work as decoding its weights).
//
// Shape of the work: a block of 4 warps owns 64 output rows x 32 tokens of one
// problem (grid: row tiles x problems x token tiles), or, for problems of at
// most 16 tokens (a prompt's typical expert), 128 rows x 16 tokens: the warps
// then all multiply, and each step's split activations serve twice the rows;
// for many tokens on a large grid (tile_shapes() says when) a block of 8 warps owns
// 128 rows x 64 tokens (each warp 32 x 32), so each decoded weight and each
// split activation serves twice as many products as in 64 x 32.
// Every 256 inputs it loads the tile's rows' byte windows (coalesced, one window
// ahead); per step of 64 inputs it copies the tokens' split activations into
// shared memory (cp.async, in flight while it decodes), decodes the rows' two
// 32-input chunks into bf16 (one thread per row chunk, two each with 128 rows),
// then each warp multiplies its 32 rows x 16 tokens with m16n8k16 mma, three per
// product (one per term).
// Types whose chunk scale the bf16 value cannot absorb exactly (all but MXFP4)
// sum each chunk in a register tile of its own and add it times the scale.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "quant_blocks.cuh"
#include "quant_mma.h"

namespace xpack::kernels {
namespace dev {

namespace {

constexpr int kStep = 64;
// Weights are fetched 256 inputs (8 blocks) per row at a time, as 16-byte
// aligned loads of the byte window that holds them: a warp then reads runs of
// contiguous bytes (a block-per-thread load of 17- or 34-byte blocks touched a
// cache line per thread and made the L1 the bottleneck).
constexpr int kFetch = 256, kFetchBlocks = kFetch / 32;
// Rows the tiles take: at most 2^23 inputs, so that a tile's 128 rows span less
// than 2^31 bytes (Q8_0's, the widest, 1.14 * 2^30) and the weight fetch counts
// them in 32 bits. Longer rows (no model has them) take the other paths:
// split_rows() is 0 for them.
constexpr int64_t kMaxTileInputs = int64_t(1) << 23;
// 8 bf16 of padding per shared row: a row is 144 bytes (36 words), so the 8 rows
// one ldmatrix phase reads start in 8 different 4-bank groups.
constexpr int kLd = kStep + 8;

// row: a problem's first row of x and y; xrow: of the split activations.
struct Problems {
  int n;
  const uint8_t* w[kMaxGroupedProblems];
  int32_t row[kMaxGroupedProblems];
  int32_t xrow[kMaxGroupedProblems];
  int32_t ntok[kMaxGroupedProblems];
};

// The activations of a launch's problems, split: three bf16 terms per input,
// word j of each 32-input block holding elements j and j + 16 (the order the
// tiles store them in), and for the types with mins each token's sums of x over
// 16-input sub-blocks. Rows of ne0 / 2 words and ne0 / 16 floats.
struct SplitX {
  const uint32_t* term[3];
  const float* xsum;
};

__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t w) { return *reinterpret_cast<const __nv_bfloat162*>(&w); }
__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return bf162_bits(__floats2bfloat162_rn(lo, hi)); }

// The three bf16 terms of two floats, by truncation: hi keeps the top 8
// significant bits, mid the next 8 of the (exact) remainder, lo the rest, which
// has at most 8 left, so hi + mid + lo == x exactly (for normal x; the terms of
// tiny x may underflow, far below the fp32 error bound of a dot product).
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const float ah = __uint_as_float(__float_as_uint(a) & 0xFFFF0000u);
  const float bh = __uint_as_float(__float_as_uint(b) & 0xFFFF0000u);
  const float ar = a - ah, br = b - bh;
  const float am = __uint_as_float(__float_as_uint(ar) & 0xFFFF0000u);
  const float bm = __uint_as_float(__float_as_uint(br) & 0xFFFF0000u);
  const float al = ar - am, bl = br - bm;
  hi = __byte_perm(__float_as_uint(ah), __float_as_uint(bh), 0x7632);
  mid = __byte_perm(__float_as_uint(am), __float_as_uint(bm), 0x7632);
  lo = __byte_perm(__float_as_uint(al), __float_as_uint(bl), 0x7632);
}

// Byte k of lo and of hi (each below 128) as the bf16 pair 128 + lo_k, 128 + hi_k
// (low half, high half): one byte permute whose other two selectors replicate
// the bytes' sign bits (0 here), then bf16 128's exponent byte. A bf16 FMA or
// subtraction then removes the 128 exactly: two instructions fewer a pair than
// forming each weight in fp32 (magic_byte) and packing the two.
__device__ __forceinline__ uint32_t bf16_pair_128(uint32_t lo, uint32_t hi, int k) {
  return prmt(lo, hi, uint32_t(k) | uint32_t(8 | k) << 4 | uint32_t(4 + k) << 8 | uint32_t(12 + k) << 12) | 0x43004300u;
}

// N 32-bit words starting at byte `off` of a shared row (aligned loads and a
// funnel shift; the row buffer has a spare word at its end for the last one).
template <int N>
__device__ __forceinline__ void smem_words(const uint32_t* row, int off, uint32_t (&w)[N]) {
  const int base = off >> 2;
  const unsigned sh = unsigned(off & 3) * 8;
  uint32_t v[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) v[i] = row[base + i];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// Byte idx (run-time, < 4N) of N words, without indexing a register array at
// run time (which would put it in local memory).
template <int N>
__device__ __forceinline__ uint32_t byte_of(const uint32_t (&w)[N], int idx) {
  uint32_t word = w[0];
#pragma unroll
  for (int i = 1; i < N; ++i) word = (idx >> 2) == i ? w[i] : word;
  return (word >> (8 * (idx & 3))) & 0xFFu;
}

// The weights of one 32-input chunk c (0..7) of a row's 256 inputs, from the
// shared window that holds their bytes (starting at byte `off` of `row`): 16
// words of bf16 pairs, and the scale the chunk's sums are multiplied by. Word t
// holds elements t and t + 16 (the order MXFP4 packs them in one byte); the
// activations are stored in the same order, so each product pairs the right
// weight and input. Types with mins also give dmin * min of the chunk's two
// 16-element sub-blocks, which multiply the sub-blocks' sums of x.
//   kWinBytes: bytes of 256 inputs; kWinChunks: 16-byte loads of a window at any
//   offset; kRowWords: a shared row (window, the funnel shift's spare word, and
//   padding to a stride of 12 banks so that neighbouring rows meet different banks);
//   kScaleInputs: how many inputs' sums the scaled types multiply by their scale at
//   once (the multiplies compete with the products for issue slots): Q8_0's block,
//   the K-quants' step of 64 of d's 256 (sums kept over steps would be live through
//   the next step's decode: Q3_K's 128 x 64 tile went from 128 registers to 169).
template <uint32_t T>
struct Block;

template <>
struct Block<kMXFP4> {
  static constexpr int kWinBytes = 8 * 17, kWinChunks = 10, kRowWords = 44;
  static constexpr bool kScaled = false;  // 2^(e-128) times a 4-bit code is exact in bf16
  static constexpr bool kMins = false;
  __device__ static float chunk(const uint32_t* row, int off, int c, uint32_t (&out)[16], float (&)[2]) {
    uint32_t v[5];
    smem_words<5>(row, off + 17 * c, v);
    // The bf16 of 2^(e-128): exact, subnormal for e < 7 (bf16 has fp32's range).
    const __nv_bfloat16 sb = __float2bfloat16_rn(e8m0_half(v[0] & 0xFFu));
    const __nv_bfloat162 s2 = __halves2bfloat162(sb, sb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = __funnelshift_r(v[i], v[i + 1], 8);  // code bytes 4i..4i+3
      // Selectors: the 3-bit magnitude index of each code, 4 per word, as the
      // nibbles PRMT reads (byte k's code -> nibble k).
      const uint32_t ml = q & 0x07070707u, mh = (q >> 4) & 0x07070707u;
      const uint32_t sl = __byte_perm(ml | (ml >> 4), 0u, 0x4420u);
      const uint32_t sh = __byte_perm(mh | (mh >> 4), 0u, 0x4420u);
      // bf16 of 0 1 2 3 4 6 8 12: low bytes 00 80 00 40 80 c0 00 40, high bytes
      // 00 3f 40 40 40 40 41 41; the code's bit 3 is the sign (bit 7 of the high byte).
      const uint32_t lo_l = __byte_perm(0x40008000u, 0x4000C080u, sl);
      const uint32_t hi_l = __byte_perm(0x40403F00u, 0x41414040u, sl) | ((q & 0x08080808u) << 4);
      const uint32_t lo_h = __byte_perm(0x40008000u, 0x4000C080u, sh);
      const uint32_t hi_h = __byte_perm(0x40403F00u, 0x41414040u, sh) | (q & 0x80808080u);
      const uint32_t l01 = __byte_perm(lo_l, hi_l, 0x5140u), l23 = __byte_perm(lo_l, hi_l, 0x7362u);
      const uint32_t h01 = __byte_perm(lo_h, hi_h, 0x5140u), h23 = __byte_perm(lo_h, hi_h, 0x7362u);
      const uint32_t w[4] = {__byte_perm(l01, h01, 0x5410u), __byte_perm(l01, h01, 0x7632u),
                             __byte_perm(l23, h23, 0x5410u), __byte_perm(l23, h23, 0x7632u)};
#pragma unroll
      for (int k = 0; k < 4; ++k) out[4 * i + k] = bf162_bits(__hmul2(as_bf162(w[k]), s2));
    }
    return 1.0f;
  }
};

template <>
struct Block<kQ8_0> {
  static constexpr int kWinBytes = 8 * 34, kWinChunks = 18, kRowWords = 76;
  static constexpr bool kScaled = true;  // d (fp16) times an int8 needs up to 19 bits
  static constexpr int kScaleInputs = 32;
  static constexpr bool kMins = false;
  __device__ static float chunk(const uint32_t* row, int off, int c, uint32_t (&out)[16], float (&)[2]) {
    uint32_t v[9];
    smem_words<9>(row, off + 34 * c, v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Signed bytes + 128, as unsigned: quants 4i.. and 4i+16..
      const uint32_t lo = __funnelshift_r(v[i], v[i + 1], 16) ^ 0x80808080u;
      const uint32_t hi = __funnelshift_r(v[i + 4], v[i + 5], 16) ^ 0x80808080u;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[4 * i + k] = pack_bf16(magic_byte(lo, k) - (kMagic + 128.0f), magic_byte(hi, k) - (kMagic + 128.0f));
    }
    return h2f(v[0]);
  }
};

// Q3_K: hmask[32], qs[64], scales[12], d. Chunk c is half h = c / 4, shift
// g = c % 4 of the 2-bit quants; its sub-blocks 2c, 2c + 1 have 6-bit signed
// scales, and scale * quant (|.| <= 128) is exact in bf16. The sums times d.
template <>
struct Block<kQ3_K> {
  static constexpr int kWinBytes = 110, kWinChunks = 8, kRowWords = 44;
  static constexpr bool kScaled = true;
  static constexpr int kScaleInputs = kStep;
  static constexpr bool kMins = false;
  __device__ static float chunk(const uint32_t* row, int off, int c, uint32_t (&out)[16], float (&)[2]) {
    const int h = c >> 2, g = c & 3;
    uint32_t qw[8], hw[8], sw[3], dw[1];
    smem_words<8>(row, off + 32 + 32 * h, qw);
    smem_words<8>(row, off, hw);
    smem_words<3>(row, off + 96, sw);
    smem_words<1>(row, off + 108, dw);
    float sc[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int j = 2 * c + k;
      const uint32_t lo4 = j < 8 ? (byte_of(sw, j) & 0xFu) : (byte_of(sw, j - 8) >> 4);
      const uint32_t hi2 = (byte_of(sw, 8 + (j & 3)) >> (2 * (j >> 2))) & 3u;
      sc[k] = float(int(lo4 | (hi2 << 4)) - 32);
    }
    // (128 + quant + 4) - 132 and its product with the scale are exact in bf16
    // (|scale * quant| <= 128), so the words are those of the fp32 forms.
    const __nv_bfloat162 sc2 = __floats2bfloat162_rn(sc[0], sc[1]);
    const __nv_bfloat162 off2 = __floats2bfloat162_rn(-132.0f, -132.0f);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // quant + 4 = low 2 bits + 4 * high bit, in 0..7, four per word
      const uint32_t lo = ((qw[i] >> (2 * g)) & 0x03030303u) | (((hw[i] >> (4 * h + g)) & 0x01010101u) << 2);
      const uint32_t hi = ((qw[i + 4] >> (2 * g)) & 0x03030303u) | (((hw[i + 4] >> (4 * h + g)) & 0x01010101u) << 2);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[4 * i + k] = bf162_bits(__hmul2(__hadd2(as_bf162(bf16_pair_128(lo, hi, k)), off2), sc2));
    }
    return h2f(dw[0]);
  }
};

// Q2_K: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin. A weight is
// d * scale * q - dmin * min: the first term on the tensor cores (scale * q <= 45
// is exact in bf16), the second applied to the sub-block's sum of x.
template <>
struct Block<kQ2_K> {
  static constexpr int kWinBytes = 84, kWinChunks = 7, kRowWords = 44;
  static constexpr bool kScaled = true;
  static constexpr int kScaleInputs = kStep;
  static constexpr bool kMins = true;
  __device__ static float chunk(const uint32_t* row, int off, int c, uint32_t (&out)[16], float (&dm)[2]) {
    const int h = c >> 2, g = c & 3;
    uint32_t qw[8], sw[1], dw[1];
    smem_words<8>(row, off + 16 + 32 * h, qw);
    smem_words<1>(row, off + 2 * c, sw);
    smem_words<1>(row, off + 80, dw);
    const float sc0 = float(sw[0] & 0xFu), sc1 = float((sw[0] >> 8) & 0xFu);
    const float dmin = h2f(dw[0] >> 16);
    dm[0] = dmin * float((sw[0] >> 4) & 0xFu);
    dm[1] = dmin * float((sw[0] >> 12) & 0xFu);
    // (128 + quant) * scale - 128 * scale in one bf16 FMA: every value in it is
    // exact in bf16 and the result (<= 45) too, so the words are those of the
    // fp32 forms.
    const __nv_bfloat162 sc2 = __floats2bfloat162_rn(sc0, sc1);
    const __nv_bfloat162 off2 = __floats2bfloat162_rn(-128.0f * sc0, -128.0f * sc1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (qw[i] >> (2 * g)) & 0x03030303u, hi = (qw[i + 4] >> (2 * g)) & 0x03030303u;
#pragma unroll
      for (int k = 0; k < 4; ++k) out[4 * i + k] = bf162_bits(__hfma2(as_bf162(bf16_pair_128(lo, hi, k)), sc2, off2));
    }
    return h2f(dw[0]);
  }
};

__device__ __forceinline__ void ldmatrix4(uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A block's shape: WM warps along the rows (32 rows each) by WN along the
// tokens, each warp NT columns of 8 tokens. Its shared memory is dynamic (the
// 128-row tiles of the scaled types need more than the 48 KiB a static array
// may have).
template <uint32_t T, int WM, int WN, int NT>
struct Tile {
  using B = Block<T>;
  static constexpr int kRows = 32 * WM, kTokens = 8 * NT * WN, kThreads = 32 * WM * WN;
  static_assert(NT % 2 == 0, "tokens are read 16 at a time");
  static_assert(kTokens <= kThreads / 4, "four threads copy each token's activations");
  // The 128 x 64 tiles hold one or two blocks an SM (registers), too few to hide
  // a step's activation copy behind other blocks' work: they copy the next
  // step's while this one's multiply (measured on the H200, 2026-12-04: Q8_0 and
  // Q2_K at 4096 x 14336, 512 tokens, lost 8-10 % with one stage). Two stages
  // keep every type's blocks an SM there (shared memory is not what limits them).
  static constexpr int kXStages = kTokens >= 64 ? 2 : 1;
  // Resident blocks an SM asked of ptxas (__launch_bounds__; 0: none asked,
  // ptxas' own choice). The 128 x 64 tiles ask for two, which caps them at 128
  // registers: main's ptxas gave Q2_K's 181 and one block an SM (Q3_K's and
  // MXFP4's were below 128 already). doc/kernels.md, "The 128 x 64 tiles held to
  // 128 registers", has the measurements, and why the others ask for nothing: an
  // explicit minimum of one block let ptxas take more registers than without.
  static constexpr int kMinBlocks = kTokens == 64 ? 2 : 0;
  static constexpr size_t kWs = 0;                                                // bf16 [kRows][kLd]
  static constexpr size_t kXs = kWs + sizeof(__nv_bfloat16) * kRows * kLd;  // bf16 [kXStages][3][kTokens][kLd]
  static constexpr size_t kRaw = kXs + sizeof(__nv_bfloat16) * kXStages * 3 * kTokens * kLd;  // u32 [kRows][kRowWords]
  static constexpr size_t kScale = kRaw + sizeof(uint32_t) * kRows * B::kRowWords;  // f32 [kRows][2]
  static constexpr size_t kMinsAt = kScale + sizeof(float) * kRows * (kStep / 32);  // f32 [kRows or 1][4]
  static constexpr size_t kXsum = kMinsAt + sizeof(float) * (B::kMins ? kRows : 1) * (kStep / 16);
  static constexpr size_t kBytes = kXsum + sizeof(float) * kXStages * (B::kMins ? kTokens : 1) * (kStep / 16);
};

// Every output's sequence of operations (the steps, within a step the 16-input
// slices, within a slice the three terms, the scale after each kScaleInputs) is
// the same in every tile shape, so a problem's bits do not depend on its tile.
template <uint32_t T, int WM, int WN, int NT>
__global__ void __launch_bounds__(Tile<T, WM, WN, NT>::kThreads, Tile<T, WM, WN, NT>::kMinBlocks)
    mma_kernel(Problems ps, int64_t ne0, int64_t ne1, size_t rb, SplitX sx, float* __restrict__ y) {
  using B = Block<T>;
  using L = Tile<T, WM, WN, NT>;
  constexpr int kRows = L::kRows, kTokens = L::kTokens, kThreads = L::kThreads, kWarpTokens = 8 * NT;
  const int p = blockIdx.y;
  const int ntok = ps.ntok[p];
  const int tok0 = blockIdx.z * kTokens;
  if (tok0 >= ntok) return;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint8_t* __restrict__ w = ps.w[p];

  extern __shared__ __align__(16) uint8_t smem[];
  auto ws = reinterpret_cast<__nv_bfloat16(*)[kLd]>(smem + L::kWs);
  auto xs = reinterpret_cast<__nv_bfloat16(*)[3][kTokens][kLd]>(smem + L::kXs);
  auto scale = reinterpret_cast<float(*)[kStep / 32]>(smem + L::kScale);
  // Types with mins: dmin * min per row and 16-input sub-block of the step, and
  // each token's sums of x over those sub-blocks.
  auto mins = reinterpret_cast<float(*)[kStep / 16]>(smem + L::kMinsAt);
  auto xsum = reinterpret_cast<float(*)[kTokens][kStep / 16]>(smem + L::kXsum);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WM, wn = warp / WM;  // this warp: rows 32*wm.., tokens kWarpTokens*wn..
  const int wt0 = kWarpTokens * wn;
  // Token columns past the problem's end are zeros: their products are skipped
  // (a warp-uniform test), which is most of the work of a 12-token expert.
  bool live[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) live[nt] = tok0 + wt0 + 8 * nt < ntok;

  // Weight fetch: chunk c of the tile's windows -> (row c / kWinChunks, chunk
  // c % kWinChunks), so consecutive threads read consecutive 16 bytes of a row.
  // Byte offsets from the tile's first row in 32 bits (launch() keeps a tile's
  // rows below 2^31 bytes): its start, 16-byte aligned since w is and kRows is a
  // multiple of 16, gives the 16-byte pieces of the offsets from w. In 64 bits
  // they took about 50 instructions a piece, on every window's path between two
  // barriers (SASS, 2026-12-05).
  constexpr int kChunks = kRows * B::kWinChunks;
  constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  auto wraw = reinterpret_cast<uint32_t(*)[B::kRowWords]>(smem + L::kRaw);
  const uint8_t* __restrict__ wt = w + size_t(row0) * rb;
  const uint32_t rb32 = uint32_t(rb);
  const int rows_here = int(ne1 - row0 < kRows ? ne1 - row0 : kRows);
  // The matrix's bytes from the tile's start on, as far as a tile reads.
  const size_t after = rb * size_t(ne1) - size_t(row0) * rb;
  const uint32_t tail = after < size_t(0xFFFFFFFFu) ? uint32_t(after) : 0xFFFFFFFFu;
  uint4 wreg[kPerThread];
  auto fetch = [&](int k0) {
    const uint32_t win = uint32_t(k0 / kFetch) * uint32_t(B::kWinBytes);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int c = tid + j * kThreads;
      const int r = c / B::kWinChunks, u = c % B::kWinChunks;
      wreg[j] = make_uint4(0u, 0u, 0u, 0u);
      if (c >= kChunks || r >= rows_here) continue;
      const uint32_t row_at = uint32_t(r) * rb32;
      const uint32_t start = row_at + win;
      const uint32_t end = min(start + uint32_t(B::kWinBytes), row_at + rb32);
      const uint32_t at = (start & ~15u) + 16u * uint32_t(u);
      if (at >= end) continue;
      if (at + 16u <= tail) {
        wreg[j] = __ldg(reinterpret_cast<const uint4*>(wt + at));
      } else {  // the matrix's last bytes: nothing past its end is read
        uint32_t v[4] = {0u, 0u, 0u, 0u};
        for (uint32_t i = at; i < tail; ++i) v[(i - at) >> 2] |= uint32_t(wt[i]) << (8 * ((i - at) & 3));
        wreg[j] = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
  };
  auto stash = [&]() {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int c = tid + j * kThreads;
      if (c < kChunks)
        reinterpret_cast<uint4*>(&wraw[c / B::kWinChunks][0])[c % B::kWinChunks] = wreg[j];
    }
  };

  // Decode roles: thread -> (row, block lb of each 64-input step), kDecodes of
  // them (rows lr, lr + kThreads / 2, ...). Activations: thread -> (token, block c
  // of the step, half h): the split words 8h..8h+7 of the block (inputs 8h.. and
  // 16+8h.., paired), 32 bytes a term; with 16 tokens the upper half of the
  // threads has none.
  constexpr int kDecodes = 2 * kRows / kThreads;
  const int lr = tid >> 1, lb = tid & 1;
  const int xt = tid >> 2, xc = (tid >> 1) & 1, xh = tid & 1;
  const bool x_role = xt < kTokens;
  const bool tok_ok = x_role && tok0 + xt < ntok;
  const int n_in = int(ne0), n_blocks = n_in / 32;  // launch() takes rows of at most kMaxTileInputs
  const uint32_t xr = uint32_t(ps.xrow[p] + tok0 + (tok_ok ? xt : 0));
  // This thread's first split word and sum of x: 32-bit offsets (split_rows keeps
  // a launch's split activations below 2^31 words), so that a step's copy costs
  // no 64-bit address arithmetic.
  const uint32_t x_word = xr * uint32_t(ne0 / 2) + uint32_t(16 * xc + 8 * xh);
  const uint32_t x_sum = xr * uint32_t(ne0 / 16);

  // A token past the problem's end or a block past the row's end is zeros
  // (copied from nowhere: zfill 16 reads no byte).
  auto load_x = [&](int k0, int stage) {
    if (!x_role) return;
    const bool ok = tok_ok && k0 / 32 + xc < n_blocks;
    const uint32_t word = ok ? x_word + uint32_t(k0 / 2) : 0u;
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      auto* dst = reinterpret_cast<uint4*>(&xs[stage][m][xt][32 * xc + 16 * xh]);
      const uint32_t* src = sx.term[m] + word;
      __pipeline_memcpy_async(dst, src, 16, ok ? 0 : 16);
      __pipeline_memcpy_async(dst + 1, src + 4, 16, ok ? 0 : 16);
    }
    if constexpr (B::kMins) {  // the step's four sub-block sums (ne0 is whole 256s)
      if (xc == 0 && xh == 0) {
        const float* src = sx.xsum + (tok_ok ? x_sum + uint32_t(k0 / 16) : 0u);
        __pipeline_memcpy_async(&xsum[stage][xt][0], src, 16, tok_ok ? 0 : 16);
      }
    }
    __pipeline_commit();
  };

  float acc[2][NT][4] = {};
  float part[2][NT][4] = {};  // the current block's sums (scaled types)

  fetch(0);
  if constexpr (L::kXStages == 2) load_x(0, 0);
  for (int k0 = 0; k0 < n_in; k0 += kStep) {
    const int stage = L::kXStages == 2 ? (k0 / kStep) & 1 : 0;
    if (k0 % kFetch == 0) {  // a new window: previous decodes are done with wraw
      __syncthreads();
      stash();
      if (k0 + kFetch < n_in) fetch(k0 + kFetch);  // in flight for the next 4 steps
      __syncthreads();
    }
    // In flight while the weights decode (one stage: the last step's products are
    // done with it; two: this step's was copied during the last step's products).
    const bool ahead = L::kXStages == 2 && k0 + kStep < n_in;
    if constexpr (L::kXStages == 2) {
      if (ahead) load_x(k0 + kStep, stage ^ 1);
    } else {
      load_x(k0, 0);
    }
#pragma unroll
    for (int d = 0; d < kDecodes; ++d) {  // weights -> bf16 in shared memory
      const int r = lr + d * (kThreads / 2);
      const int blk = k0 / 32 + lb;
      uint32_t v[16];
      float s = 0.0f, dm[2] = {0.0f, 0.0f};
      if (row0 + r < ne1 && blk < n_blocks) {
        const int off = int((uint32_t(r) * rb32 + uint32_t(k0 / kFetch) * uint32_t(B::kWinBytes)) & 15u);
        s = B::chunk(&wraw[r][0], off, int(blk % kFetchBlocks), v, dm);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = 0u;
      }
      uint4* dst = reinterpret_cast<uint4*>(&ws[r][lb * 32]);
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[i] = make_uint4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
      if constexpr (B::kScaled) scale[r][lb] = s;
      if constexpr (B::kMins) {
        mins[r][2 * lb] = dm[0];
        mins[r][2 * lb + 1] = dm[1];
      }
    }
    if (ahead) __pipeline_wait_prior(1);  // this step's copy, not the next one's
    else __pipeline_wait_prior(0);
    __syncthreads();

    // The products, with every token column live (warp-uniform, and all a
    // tile's warps but at a problem's end) or not: without the per-column tests
    // the warp's products are one straight run, so its ldmatrix loads are
    // scheduled ahead of the mma that wait on them, and no mma needs a warp sync
    // of its own (SASS: a WARPSYNC, and a branch or test, before each of them).
    // The same operations on the live columns either way, so the same bits.
    auto products = [&](auto all_live) {
      constexpr bool kAllLive = decltype(all_live)::value;
#pragma unroll
      for (int ks = 0; ks < kStep / 16; ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          ldmatrix4(a[mt], &ws[32 * wm + 16 * mt + (lane & 15)][16 * ks + (lane >> 4) * 8]);
        // Smallest terms first, so the large one is added to sums already formed.
#pragma unroll
        for (int m = 2; m >= 0; --m) {
#pragma unroll
          for (int j = 0; j < NT / 2; ++j) {
            if (!kAllLive && !live[2 * j]) continue;
            uint32_t b[4];  // b[0], b[1]: tokens 16j..16j+7 of this warp; b[2], b[3]: the next 8
            ldmatrix4(b, &xs[stage][m][wt0 + 16 * j + ((lane >> 4) << 3) + (lane & 7)][16 * ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              float (&c0)[4] = B::kScaled ? part[mt][2 * j] : acc[mt][2 * j];
              float (&c1)[4] = B::kScaled ? part[mt][2 * j + 1] : acc[mt][2 * j + 1];
              mma16816(c0, a[mt], b[0], b[1]);
              if (kAllLive || live[2 * j + 1]) mma16816(c1, a[mt], b[2], b[3]);
            }
          }
        }
        if constexpr (B::kScaled) {
          if (ks & 1) {  // a 32-element block is complete
            const int g = lane >> 2;
            // Its scale's last block: the sums so far times the scale, into acc.
            const bool scale_ends = (k0 + 16 * (ks + 1)) % B::kScaleInputs == 0;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              if (scale_ends) {
                const float s0 = scale[32 * wm + 16 * mt + g][ks >> 1];
                const float s1 = scale[32 * wm + 16 * mt + g + 8][ks >> 1];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                  acc[mt][nt][0] = fmaf(part[mt][nt][0], s0, acc[mt][nt][0]);
                  acc[mt][nt][1] = fmaf(part[mt][nt][1], s0, acc[mt][nt][1]);
                  acc[mt][nt][2] = fmaf(part[mt][nt][2], s1, acc[mt][nt][2]);
                  acc[mt][nt][3] = fmaf(part[mt][nt][3], s1, acc[mt][nt][3]);
#pragma unroll
                  for (int i = 0; i < 4; ++i) part[mt][nt][i] = 0.0f;
                }
              }
              if constexpr (B::kMins) {  // - dmin * min * (sum of x) per sub-block
                const int sb = 2 * (ks >> 1);
                const int r0 = 32 * wm + 16 * mt + g;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    const int r = r0 + 8 * (i >> 1), t = wt0 + 8 * nt + 2 * (lane & 3) + (i & 1);
                    acc[mt][nt][i] = fmaf(-mins[r][sb + 1], xsum[stage][t][sb + 1],
                                          fmaf(-mins[r][sb], xsum[stage][t][sb], acc[mt][nt][i]));
                  }
              }
            }
          }
        }
      }
    };
    if (live[NT - 1]) products(std::true_type{});
    else if (live[0]) products(std::false_type{});
    __syncthreads();
  }

  // Accumulator layout of m16n8: c0, c1 are row g, tokens 2q, 2q+1; c2, c3 row g + 8.
  const int g = lane >> 2, q = lane & 3;
  float* __restrict__ yp = y + (int64_t(ps.row[p]) + tok0) * ne1;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = row0 + 32 * wm + 16 * mt + g + 8 * (i >> 1);
        const int t = wt0 + 8 * nt + 2 * q + (i & 1);
        if (r < ne1 && tok0 + t < ntok) yp[int64_t(t) * ne1 + r] = acc[mt][nt][i];
      }
}

// The split activations of a launch's problems: grid.y = problem, threads over
// its tokens' words (two inputs each) and, for the types with mins, then over its
// tokens' 16-input sub-blocks. The sums are added in the order the tiles added
// them when they split x themselves (halves of 8 inputs, each as pairs of pairs),
// so the results kept their bits.
__global__ void split_kernel(Problems ps, int64_t ne0, const float* __restrict__ x, uint32_t* __restrict__ hi,
                             uint32_t* __restrict__ mid, uint32_t* __restrict__ lo, float* __restrict__ xsum) {
  const int p = blockIdx.y;
  const int64_t words = int64_t(ps.ntok[p]) * (ne0 / 2);
  const int64_t sums = xsum ? int64_t(ps.ntok[p]) * (ne0 / 16) : 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words + sums;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (i < words) {
      const int64_t t = i / (ne0 / 2), wd = i % (ne0 / 2);
      const float* xr = x + (int64_t(ps.row[p]) + t) * ne0 + (wd / 16) * 32 + wd % 16;
      const int64_t at = (int64_t(ps.xrow[p]) + t) * (ne0 / 2) + wd;
      split2(__ldg(xr), __ldg(xr + 16), hi[at], mid[at], lo[at]);
    } else {
      const int64_t j = i - words, t = j / (ne0 / 16), sb = j % (ne0 / 16);
      const float* v = x + (int64_t(ps.row[p]) + t) * ne0 + 16 * sb;
      float h[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float* e = v + 8 * k;
        h[k] = ((__ldg(e) + __ldg(e + 1)) + (__ldg(e + 2) + __ldg(e + 3))) +
               ((__ldg(e + 4) + __ldg(e + 5)) + (__ldg(e + 6) + __ldg(e + 7)));
      }
      xsum[(int64_t(ps.xrow[p]) + t) * (ne0 / 16) + sb] = h[0] + h[1];
    }
  }
}

// One row of x split: three bf16 terms per input, and for the types with mins
// a float per 16 inputs (their sum).
constexpr size_t split_row_bytes(bool mins, int64_t ne0) {
  return size_t(ne0) * 2 * 3 + (mins ? size_t(ne0 / 16) * 4 : 0);
}
// Each of split_layout()'s four parts is rounded up to 256 bytes.
constexpr size_t kSplitSpare = 4 * 255;

// Where each part of the split activations of n rows lies in the workspace.
struct SplitLayout {
  size_t term_bytes, sum_bytes;
};
SplitLayout split_layout(bool mins, int64_t ne0, int64_t n_rows) {
  const auto up = [](size_t v) { return (v + 255) & ~size_t(255); };
  SplitLayout l{};
  l.term_bytes = up(size_t(n_rows) * size_t(ne0) * 2);
  l.sum_bytes = mins ? up(size_t(n_rows) * size_t(ne0 / 16) * 4) : 0;
  return l;
}

template <uint32_t T>
int64_t split_rows(int64_t ne0, size_t workspace_bytes) {
  const size_t row = split_row_bytes(Block<T>::kMins, ne0);
  if (ne0 <= 0 || ne0 > kMaxTileInputs || workspace_bytes < kSplitSpare + row) return 0;
  // At most 2^31 words of a term, so the tiles address them with 32-bit offsets.
  return int64_t(std::min<size_t>((workspace_bytes - kSplitSpare) / row, (size_t(1) << 31) / size_t(ne0 / 2 + 1)));
}

template <uint32_t T, int WM, int WN, int NT>
int launch_tiles(int64_t ne0, int64_t ne1, const Problems& ps, int max_tok, const SplitX& sx, float* y,
                 cudaStream_t stream) {
  using L = Tile<T, WM, WN, NT>;
  const int64_t row_tiles = (ne1 + L::kRows - 1) / L::kRows;
  const int64_t tok_tiles = (max_tok + L::kTokens - 1) / L::kTokens;
  if (row_tiles > 0x7FFFFFFF || tok_tiles > 65535) return kErrShape;
  if (L::kBytes > 48 * 1024 &&
      cudaFuncSetAttribute(mma_kernel<T, WM, WN, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(L::kBytes)) != cudaSuccess)
    return kErrCuda;
  const dim3 grid{unsigned(row_tiles), unsigned(ps.n), unsigned(tok_tiles)};
  mma_kernel<T, WM, WN, NT><<<grid, L::kThreads, L::kBytes, stream>>>(ps, ne0, ne1, row_bytes(T, ne0), sx, y);
  return cudaGetLastError() == cudaSuccess ? kOk : kErrCuda;
}

// Three tile shapes; a problem's bits do not depend on which it gets. Up to 16
// tokens 128 rows x 16 (a prompt's typical expert: all four warps multiply);
// else 64 x 32, or 128 x 64 with 8 warps of 32 x 32, where each decoded weight
// serves 64 tokens and each split activation 128 rows, twice what either did in
// 64 x 32 (the decode and split, not the tensor cores, set the smaller tiles'
// time). The large tiles held one block an SM (200+ registers a thread), so
// they paid only with many blocks and few idle token columns: measured on the
// H200 (bench-kernels, 2026-12-04), 1.16-1.20x on a 4096 x 14336 Q8_0 / MXFP4
// product of 512 tokens (256 large blocks) and 1.03-1.06x for Q2_K / Q3_K, but
// 0.80-0.94x on 2048- and 3072-row experts of 512 tokens (128 and 192 blocks)
// and 0.69-0.87x on five 96-token experts (a third of their columns idle); a
// Kimi-K3 prompt of 4096 tokens, whose experts get about 233 tokens each, was
// 0.99x with them forced from 128 or 64 tokens (xpack-run --mma-large-from). By
// default a problem takes them from kLargeTokens tokens when the launch's large
// blocks number at least kLargeBlocks; set_mma_large_from(n) forces them from
// n tokens whatever the grid. Since 2026-12-05 they hold two blocks an SM
// (Tile::kMinBlocks); measured again then on the Kimi-K3 prompt (H100), forcing
// them from 33 or 17 tokens was 0.99-1.01x and 0.97-1.00x of the rule.
constexpr int kLargeTokens = 256, kLargeBlocks = 256;
std::atomic<int> g_large_from{0};

enum TileShape : uint8_t { kFew, kMany, kLarge };

// Each problem's tile shape, from its whole token count and the whole launch's
// grid (not from the parts a small workspace cuts it into).
template <uint32_t T>
void tile_shapes(int64_t ne1, const ExpertProblem* problems, int n, TileShape* shape) {
  using Large = Tile<T, 4, 2, 4>;
  constexpr int kFewTokens = Tile<T, 4, 1, 2>::kTokens;
  const int forced = g_large_from.load(std::memory_order_relaxed);
  int large_from = forced > 0 ? forced : kLargeTokens;
  if (forced <= 0) {
    int64_t blocks = 0;
    for (int i = 0; i < n; ++i)
      if (problems[i].n_tokens >= large_from)
        blocks += (ne1 + Large::kRows - 1) / Large::kRows * ((problems[i].n_tokens + Large::kTokens - 1) / Large::kTokens);
    if (blocks < kLargeBlocks) large_from = INT32_MAX;
  }
  for (int i = 0; i < n; ++i) {
    const int nt = problems[i].n_tokens;
    shape[i] = nt <= kFewTokens ? kFew : nt < large_from ? kMany : kLarge;
  }
}

// One launch per tile shape over problems whose split activations are in the
// workspace (xrow set); shape[i] is problem i's.
template <uint32_t T>
int launch_split(int64_t ne0, int64_t ne1, const Problems& all, const TileShape* shape, const SplitX& sx, float* y,
                 cudaStream_t stream) {
  Problems by[3]{};
  int max_tok[3]{};
  for (int i = 0; i < all.n; ++i) {
    Problems& ps = by[shape[i]];
    ps.w[ps.n] = all.w[i];
    ps.row[ps.n] = all.row[i];
    ps.xrow[ps.n] = all.xrow[i];
    ps.ntok[ps.n] = all.ntok[i];
    ++ps.n;
    max_tok[shape[i]] = std::max(max_tok[shape[i]], all.ntok[i]);
  }
  if (by[kFew].n > 0)
    if (const int st = launch_tiles<T, 4, 1, 2>(ne0, ne1, by[kFew], max_tok[kFew], sx, y, stream); st != kOk)
      return st;
  if (by[kMany].n > 0)
    if (const int st = launch_tiles<T, 2, 2, 2>(ne0, ne1, by[kMany], max_tok[kMany], sx, y, stream); st != kOk)
      return st;
  if (by[kLarge].n > 0) return launch_tiles<T, 4, 2, 4>(ne0, ne1, by[kLarge], max_tok[kLarge], sx, y, stream);
  return kOk;
}

// The problems in batches whose split activations fit the workspace (a problem
// of more tokens than fit goes in parts of tokens, each a problem of its own: a
// token's outputs depend on its own activations only, so the bits are those of
// one launch); per batch one split launch, then the tiles.
template <uint32_t T>
int launch(int64_t ne0, int64_t ne1, const ExpertProblem* problems, int n, const float* x, float* y, void* workspace,
           size_t workspace_bytes, cudaStream_t stream) {
  constexpr bool kMins = Block<T>::kMins;
  if (ne0 > kMaxTileInputs) return kErrShape;  // split_rows() is 0: the caller took another path
  const int64_t cap = split_rows<T>(ne0, workspace_bytes);
  if (cap < 1) return kErrWorkspace;
  const SplitLayout l = split_layout(kMins, ne0, cap);
  auto* base = static_cast<uint8_t*>(workspace);
  auto* term0 = reinterpret_cast<uint32_t*>(base);
  auto* term1 = reinterpret_cast<uint32_t*>(base + l.term_bytes);
  auto* term2 = reinterpret_cast<uint32_t*>(base + 2 * l.term_bytes);
  float* sums = kMins ? reinterpret_cast<float*>(base + 3 * l.term_bytes) : nullptr;
  const SplitX sx{{term0, term1, term2}, sums};
  TileShape shape[kMaxGroupedProblems];
  tile_shapes<T>(ne1, problems, n, shape);

  Problems batch{};
  TileShape batch_shape[kMaxGroupedProblems];
  int64_t rows = 0;
  auto flush = [&]() -> int {
    if (batch.n == 0) return kOk;
    int64_t most = 0;
    for (int i = 0; i < batch.n; ++i) most = most > batch.ntok[i] ? most : batch.ntok[i];
    const int64_t work = most * (ne0 / 2 + (kMins ? ne0 / 16 : 0));
    const unsigned blocks = unsigned(std::min<int64_t>((work + 255) / 256, 1024));
    split_kernel<<<dim3{blocks, unsigned(batch.n)}, 256, 0, stream>>>(batch, ne0, x, term0, term1, term2, sums);
    if (cudaGetLastError() != cudaSuccess) return kErrCuda;
    const int st = launch_split<T>(ne0, ne1, batch, batch_shape, sx, y, stream);
    batch.n = 0;
    rows = 0;
    return st;
  };
  for (int i = 0; i < n; ++i) {
    const ExpertProblem& p = problems[i];
    for (int t0 = 0; t0 < p.n_tokens;) {
      if (rows == cap || batch.n == kMaxGroupedProblems)
        if (const int st = flush(); st != kOk) return st;
      const int part = int(std::min<int64_t>(p.n_tokens - t0, cap - rows));
      batch.w[batch.n] = static_cast<const uint8_t*>(p.w);
      batch.row[batch.n] = p.row + t0;
      batch.xrow[batch.n] = int32_t(rows);
      batch.ntok[batch.n] = part;
      batch_shape[batch.n] = shape[i];
      ++batch.n;
      rows += part;
      t0 += part;
    }
  }
  return flush();
}

// f(std::integral_constant<uint32_t, T>) for the types the tiles take, else r.
template <class R, class F>
R by_type(uint32_t type, R r, F f) {
  switch (type) {
    case kMXFP4: return f(std::integral_constant<uint32_t, kMXFP4>{});
    case kQ8_0: return f(std::integral_constant<uint32_t, kQ8_0>{});
    case kQ3_K: return f(std::integral_constant<uint32_t, kQ3_K>{});
    case kQ2_K: return f(std::integral_constant<uint32_t, kQ2_K>{});
    default: return r;
  }
}

}  // namespace

int mma_large_from() { return g_large_from.load(std::memory_order_relaxed); }

void set_mma_large_from(int n) { g_large_from.store(n > 0 ? n : 0, std::memory_order_relaxed); }

bool mma_supports(uint32_t type) {
  return by_type(type, false, [](auto) { return true; });
}

size_t mma_split_bytes(uint32_t type, int64_t ne0, int64_t rows) {
  if (ne0 <= 0 || rows <= 0) return 0;
  return by_type(type, size_t(0),
                 [&](auto t) { return kSplitSpare + size_t(rows) * split_row_bytes(Block<decltype(t)::value>::kMins, ne0); });
}

int64_t mma_split_rows(uint32_t type, int64_t ne0, size_t workspace_bytes) {
  return by_type(type, int64_t(0), [&](auto t) { return split_rows<decltype(t)::value>(ne0, workspace_bytes); });
}

int mma_grouped(uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* problems, int n, const float* x,
                float* y, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (n < 1 || n > kMaxGroupedProblems) return kErrArgument;
  return by_type(type, int(kErrType), [&](auto t) {
    return launch<decltype(t)::value>(ne0, ne1, problems, n, x, y, workspace, workspace_bytes, stream);
  });
}

}  // namespace dev
}  // namespace xpack::kernels
