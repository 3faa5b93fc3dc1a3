// The tensor-core prefill of quant_mma.h: bf16 mma.sync over weights decoded into
// shared memory and activations split into three exact bf16 terms.
//
// Shape of the work: a block of 4 warps owns 64 output rows x 32 tokens of one
// problem (grid: row tiles x problems x token tiles), or, for problems of at
// most 16 tokens (a prompt's typical expert), 128 rows x 16 tokens: the warps
// then all multiply, and each step's split activations serve twice the rows;
// for many tokens on a large grid (launch() says when) a block of 8 warps owns
// 128 rows x 64 tokens (each warp 32 x 32), so each decoded weight and each
// split activation serves twice as many products as in 64 x 32.
// Every 256 inputs it loads the tile's rows' byte windows (coalesced, one window
// ahead); per step of 64 inputs it decodes the rows' two 32-input chunks into
// bf16 (one thread per row chunk, two each with 128 rows), splits the tokens'
// 64 activations into hi/mid/lo bf16 (one thread per 16), then each warp
// multiplies its 32 rows x 16 tokens with m16n8k16 mma, three per product (one
// per term), while the next step's activations load.
// Types whose chunk scale the bf16 value cannot absorb exactly (all but MXFP4)
// sum each chunk in a register tile of its own and add it times the scale.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>

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
// 8 bf16 of padding per shared row: a row is 144 bytes (36 words), so the 8 rows
// one ldmatrix phase reads start in 8 different 4-bank groups.
constexpr int kLd = kStep + 8;

struct Problems {
  int n;
  const uint8_t* w[kMaxGroupedProblems];
  int32_t row[kMaxGroupedProblems];
  int32_t ntok[kMaxGroupedProblems];
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

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
//   padding to a stride of 12 banks so that neighbouring rows meet different banks).
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
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]), s2);
        out[4 * i + k] = *reinterpret_cast<const uint32_t*>(&r);
      }
    }
    return 1.0f;
  }
};

template <>
struct Block<kQ8_0> {
  static constexpr int kWinBytes = 8 * 34, kWinChunks = 18, kRowWords = 76;
  static constexpr bool kScaled = true;  // d (fp16) times an int8 needs up to 19 bits
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
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // quant + 4 = low 2 bits + 4 * high bit, in 0..7, four per word
      const uint32_t lo = ((qw[i] >> (2 * g)) & 0x03030303u) | (((hw[i] >> (4 * h + g)) & 0x01010101u) << 2);
      const uint32_t hi = ((qw[i + 4] >> (2 * g)) & 0x03030303u) | (((hw[i + 4] >> (4 * h + g)) & 0x01010101u) << 2);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[4 * i + k] = pack_bf16(sc[0] * (magic_byte(lo, k) - (kMagic + 4.0f)),
                                   sc[1] * (magic_byte(hi, k) - (kMagic + 4.0f)));
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
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (qw[i] >> (2 * g)) & 0x03030303u, hi = (qw[i + 4] >> (2 * g)) & 0x03030303u;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[4 * i + k] = pack_bf16(sc0 * (magic_byte(lo, k) - kMagic), sc1 * (magic_byte(hi, k) - kMagic));
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
  static_assert(kTokens <= kThreads / 4, "four threads split each token's activations");
  static constexpr size_t kWs = 0;                                                // bf16 [kRows][kLd]
  static constexpr size_t kXs = kWs + sizeof(__nv_bfloat16) * kRows * kLd;        // bf16 [3][kTokens][kLd]
  static constexpr size_t kRaw = kXs + sizeof(__nv_bfloat16) * 3 * kTokens * kLd;  // u32 [kRows][kRowWords]
  static constexpr size_t kScale = kRaw + sizeof(uint32_t) * kRows * B::kRowWords;  // f32 [kRows][2]
  static constexpr size_t kMinsAt = kScale + sizeof(float) * kRows * (kStep / 32);  // f32 [kRows or 1][4]
  static constexpr size_t kXsum = kMinsAt + sizeof(float) * (B::kMins ? kRows : 1) * (kStep / 16);
  static constexpr size_t kBytes = kXsum + sizeof(float) * (B::kMins ? kTokens : 1) * (kStep / 16);
};

// Every output's sequence of operations (the steps, within a step the 16-input
// slices, within a slice the three terms, the scale after each block) is the
// same in every tile shape, so a problem's bits do not depend on its tile.
template <uint32_t T, int WM, int WN, int NT>
__global__ void __launch_bounds__(Tile<T, WM, WN, NT>::kThreads)
    mma_kernel(Problems ps, int64_t ne0, int64_t ne1, size_t rb, const float* __restrict__ x, float* __restrict__ y) {
  using B = Block<T>;
  using L = Tile<T, WM, WN, NT>;
  constexpr int kRows = L::kRows, kTokens = L::kTokens, kThreads = L::kThreads, kWarpTokens = 8 * NT;
  const int p = blockIdx.y;
  const int ntok = ps.ntok[p];
  const int tok0 = blockIdx.z * kTokens;
  if (tok0 >= ntok) return;
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint8_t* __restrict__ w = ps.w[p];
  const float* __restrict__ xp = x + (int64_t(ps.row[p]) + tok0) * ne0;

  extern __shared__ __align__(16) uint8_t smem[];
  auto ws = reinterpret_cast<__nv_bfloat16(*)[kLd]>(smem + L::kWs);
  auto xs = reinterpret_cast<__nv_bfloat16(*)[kTokens][kLd]>(smem + L::kXs);
  auto scale = reinterpret_cast<float(*)[kStep / 32]>(smem + L::kScale);
  // Types with mins: dmin * min per row and 16-input sub-block of the step, and
  // each token's sums of x over those sub-blocks.
  auto mins = reinterpret_cast<float(*)[kStep / 16]>(smem + L::kMinsAt);
  auto xsum = reinterpret_cast<float(*)[kStep / 16]>(smem + L::kXsum);

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
  constexpr int kChunks = kRows * B::kWinChunks;
  constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  auto wraw = reinterpret_cast<uint32_t(*)[B::kRowWords]>(smem + L::kRaw);
  const size_t total = rb * size_t(ne1);
  uint4 wreg[kPerThread];
  auto fetch = [&](int64_t k0) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int c = tid + j * kThreads;
      const int r = c / B::kWinChunks, u = c % B::kWinChunks;
      wreg[j] = make_uint4(0u, 0u, 0u, 0u);
      if (c >= kChunks || row0 + r >= ne1) continue;
      const size_t start = size_t(row0 + r) * rb + size_t(k0 / kFetch) * B::kWinBytes;
      const size_t row_end = size_t(row0 + r) * rb + rb;
      const size_t win_end = start + size_t(B::kWinBytes);
      const size_t end = win_end < row_end ? win_end : row_end;
      const size_t at = (start & ~size_t(15)) + size_t(16) * u;
      if (at >= end) continue;
      if (at + 16 <= total) {
        wreg[j] = __ldg(reinterpret_cast<const uint4*>(w + at));
      } else {  // the matrix's last bytes: nothing past its end is read
        uint32_t v[4] = {0u, 0u, 0u, 0u};
        for (size_t i = at; i < total; ++i) v[(i - at) >> 2] |= uint32_t(w[i]) << (8 * ((i - at) & 3));
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
  // of the step, half h): inputs 8h..8h+7 and 16+8h..16+8h+7 of the block, stored
  // as the pairs (t, t + 16); with 16 tokens the upper half of the threads has none.
  constexpr int kDecodes = 2 * kRows / kThreads;
  const int lr = tid >> 1, lb = tid & 1;
  const int xt = tid >> 2, xc = (tid >> 1) & 1, xh = tid & 1;
  const bool x_role = xt < kTokens;
  const bool tok_ok = x_role && tok0 + xt < ntok;
  const int64_t n_blocks = ne0 / 32;
  const float* xrow = xp + int64_t(tok_ok ? xt : 0) * ne0;

  float4 xr[4];
  bool xr_ok = false;
  auto load_x = [&](int64_t k0) {
    const int64_t k = k0 + 32 * xc + 8 * xh;
    xr_ok = tok_ok && k < ne0;
    if (xr_ok) {
      const float4* src = reinterpret_cast<const float4*>(xrow + k);
      xr[0] = __ldg(src);
      xr[1] = __ldg(src + 1);
      xr[2] = __ldg(src + 4);  // inputs k + 16 ..
      xr[3] = __ldg(src + 5);
    }
  };

  float acc[2][NT][4] = {};
  float part[2][NT][4] = {};  // the current block's sums (scaled types)

  fetch(0);
  load_x(0);
  for (int64_t k0 = 0; k0 < ne0; k0 += kStep) {
    if (k0 % kFetch == 0) {  // a new window: previous decodes are done with wraw
      __syncthreads();
      stash();
      if (k0 + kFetch < ne0) fetch(k0 + kFetch);  // in flight for the next 4 steps
      __syncthreads();
    }
#pragma unroll
    for (int d = 0; d < kDecodes; ++d) {  // weights -> bf16 in shared memory
      const int r = lr + d * (kThreads / 2);
      const int64_t blk = k0 / 32 + lb;
      uint32_t v[16];
      float s = 0.0f, dm[2] = {0.0f, 0.0f};
      if (row0 + r < ne1 && blk < n_blocks) {
        const int off = int((size_t(row0 + r) * rb + size_t(k0 / kFetch) * B::kWinBytes) & 15);
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
    {  // activations -> three bf16 terms in shared memory
      uint32_t t[3][8];
      if (xr_ok) {
        const float lo[8] = {xr[0].x, xr[0].y, xr[0].z, xr[0].w, xr[1].x, xr[1].y, xr[1].z, xr[1].w};
        const float hi[8] = {xr[2].x, xr[2].y, xr[2].z, xr[2].w, xr[3].x, xr[3].y, xr[3].z, xr[3].w};
#pragma unroll
        for (int i = 0; i < 8; ++i) split2(lo[i], hi[i], t[0][i], t[1][i], t[2][i]);
      } else {
#pragma unroll
        for (int m = 0; m < 3; ++m)
#pragma unroll
          for (int i = 0; i < 8; ++i) t[m][i] = 0u;
      }
      if constexpr (B::kMins) {  // sub-block 2xc: the pairs' first inputs, 2xc + 1: their second
        float lo = 0.0f, hi = 0.0f;
        if (xr_ok) {
          lo = ((xr[0].x + xr[0].y) + (xr[0].z + xr[0].w)) + ((xr[1].x + xr[1].y) + (xr[1].z + xr[1].w));
          hi = ((xr[2].x + xr[2].y) + (xr[2].z + xr[2].w)) + ((xr[3].x + xr[3].y) + (xr[3].z + xr[3].w));
        }
        const float lo2 = __shfl_xor_sync(0xFFFFFFFFu, lo, 1), hi2 = __shfl_xor_sync(0xFFFFFFFFu, hi, 1);
        if (x_role && xh == 0) {
          xsum[xt][2 * xc] = lo + lo2;
          xsum[xt][2 * xc + 1] = hi + hi2;
        }
      }
      if (x_role) {
#pragma unroll
        for (int m = 0; m < 3; ++m) {
          uint4* dst = reinterpret_cast<uint4*>(&xs[m][xt][32 * xc + 16 * xh]);
          dst[0] = make_uint4(t[m][0], t[m][1], t[m][2], t[m][3]);
          dst[1] = make_uint4(t[m][4], t[m][5], t[m][6], t[m][7]);
        }
      }
    }
    __syncthreads();
    // The next step's activations are in flight while this step multiplies.
    if (k0 + kStep < ne0) load_x(k0 + kStep);

    if (live[0]) {
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
            if (!live[2 * j]) continue;
            uint32_t b[4];  // b[0], b[1]: tokens 16j..16j+7 of this warp; b[2], b[3]: the next 8
            ldmatrix4(b, &xs[m][wt0 + 16 * j + ((lane >> 4) << 3) + (lane & 7)][16 * ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              float (&c0)[4] = B::kScaled ? part[mt][2 * j] : acc[mt][2 * j];
              float (&c1)[4] = B::kScaled ? part[mt][2 * j + 1] : acc[mt][2 * j + 1];
              mma16816(c0, a[mt], b[0], b[1]);
              if (live[2 * j + 1]) mma16816(c1, a[mt], b[2], b[3]);
            }
          }
        }
        if constexpr (B::kScaled) {
          if (ks & 1) {  // a 32-element block is complete: scale its sums into acc
            const int g = lane >> 2;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
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
              if constexpr (B::kMins) {  // - dmin * min * (sum of x) per sub-block
                const int sb = 2 * (ks >> 1);
                const int r0 = 32 * wm + 16 * mt + g;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    const int r = r0 + 8 * (i >> 1), t = wt0 + 8 * nt + 2 * (lane & 3) + (i & 1);
                    acc[mt][nt][i] -= mins[r][sb] * xsum[t][sb] + mins[r][sb + 1] * xsum[t][sb + 1];
                  }
              }
            }
          }
        }
      }
    }
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

template <uint32_t T, int WM, int WN, int NT>
int launch_tiles(int64_t ne0, int64_t ne1, const Problems& ps, int max_tok, const float* x, float* y,
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
  mma_kernel<T, WM, WN, NT><<<grid, L::kThreads, L::kBytes, stream>>>(ps, ne0, ne1, row_bytes(T, ne0), x, y);
  return cudaGetLastError() == cudaSuccess ? kOk : kErrCuda;
}

// Three tile shapes; a problem's bits do not depend on which it gets. Up to 16
// tokens 128 rows x 16 (a prompt's typical expert: all four warps multiply);
// else 64 x 32, or 128 x 64 with 8 warps of 32 x 32, where each decoded weight
// serves 64 tokens and each split activation 128 rows, twice what either did in
// 64 x 32 (the decode and split, not the tensor cores, set the smaller tiles'
// time). The large tiles hold one block an SM (200+ registers a thread), so
// they pay only with many blocks and few idle token columns: measured on the
// H200 (bench-kernels, 2026-12-04), 1.16-1.20x on a 4096 x 14336 Q8_0 / MXFP4
// product of 512 tokens (256 large blocks) and 1.03-1.06x for Q2_K / Q3_K, but
// 0.80-0.94x on 2048- and 3072-row experts of 512 tokens (128 and 192 blocks)
// and 0.69-0.87x on five 96-token experts (a third of their columns idle). By
// default a problem takes them from kLargeTokens tokens when the launch's large
// blocks number at least kLargeBlocks; set_mma_large_from(n) forces them from
// n tokens whatever the grid.
constexpr int kLargeTokens = 256, kLargeBlocks = 256;
std::atomic<int> g_large_from{0};

template <uint32_t T>
int launch(int64_t ne0, int64_t ne1, const ExpertProblem* problems, int n, const float* x, float* y,
           cudaStream_t stream) {
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
  Problems few{}, many{}, large{};
  int max_few = 0, max_many = 0, max_large = 0;
  for (int i = 0; i < n; ++i) {
    const ExpertProblem& p = problems[i];
    Problems& ps = p.n_tokens <= kFewTokens ? few : p.n_tokens < large_from ? many : large;
    int& max_tok = p.n_tokens <= kFewTokens ? max_few : p.n_tokens < large_from ? max_many : max_large;
    ps.w[ps.n] = static_cast<const uint8_t*>(p.w);
    ps.row[ps.n] = p.row;
    ps.ntok[ps.n] = p.n_tokens;
    ++ps.n;
    max_tok = max_tok > p.n_tokens ? max_tok : p.n_tokens;
  }
  if (few.n > 0)
    if (const int st = launch_tiles<T, 4, 1, 2>(ne0, ne1, few, max_few, x, y, stream); st != kOk) return st;
  if (many.n > 0)
    if (const int st = launch_tiles<T, 2, 2, 2>(ne0, ne1, many, max_many, x, y, stream); st != kOk) return st;
  if (large.n > 0) return launch_tiles<T, 4, 2, 4>(ne0, ne1, large, max_large, x, y, stream);
  return kOk;
}

}  // namespace

int mma_large_from() { return g_large_from.load(std::memory_order_relaxed); }

void set_mma_large_from(int n) { g_large_from.store(n > 0 ? n : 0, std::memory_order_relaxed); }

bool mma_supports(uint32_t type) { return type == kMXFP4 || type == kQ8_0 || type == kQ3_K || type == kQ2_K; }

int mma_grouped(uint32_t type, int64_t ne0, int64_t ne1, const ExpertProblem* problems, int n,
                const float* x, float* y, cudaStream_t stream) {
  if (n < 1 || n > kMaxGroupedProblems) return kErrArgument;
  switch (type) {
    case kMXFP4: return launch<kMXFP4>(ne0, ne1, problems, n, x, y, stream);
    case kQ8_0: return launch<kQ8_0>(ne0, ne1, problems, n, x, y, stream);
    case kQ3_K: return launch<kQ3_K>(ne0, ne1, problems, n, x, y, stream);
    case kQ2_K: return launch<kQ2_K>(ne0, ne1, problems, n, x, y, stream);
    default: return kErrType;
  }
}

}  // namespace dev
}  // namespace xpack::kernels
