// The K-quants' decode on the int8 tensor cores: the pieces kquant_mmv.cu is built
// from (doc/kernels.md, "Q2_K and Q3_K on the int8 tensor cores"). test_units_on_host
// checks them on the CPU, a warp of host threads standing in for the tensor cores.
//
// Why: at two to eight tokens the dp4a units spend one lane-instruction a weight and
// token on x's four exact int8 terms, and lose to llama.cpp's one-term x under the L2
// (0.65-0.72x at eight tokens). On mma.sync each term is a B column, so eight tokens'
// four terms are four n8 tiles, and a weight costs a fraction of an instruction.
#pragma once

#include <cstdint>

#include "quant_blocks.cuh"

namespace xpack::kernels::dev::kq {

// D = A B + C, A 16 x K (row) and B K x 8 (col) int8, C and D int32; the fragments as
// in the PTX ISA: lane (g = lane / 4, c = lane % 4) holds A rows g (a[0]) and g + 8
// (a[1]) at k = 4c..4c+3 and, for K = 32, the same rows at 16 + 4c.. (a[2], a[3]);
// B column g at k = 4c.. (b0) and 16 + 4c.. (b1); C and D rows g, g + 8 at columns
// 2c, 2c + 1.
__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        const int (&c)[4]) {
#ifdef XPACK_UNITS_ON_HOST
  xpack_host_mma_k32(d, a, b0, b1, c);
#else
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#endif
}
__device__ __forceinline__ void mma_k16(int (&d)[4], const uint32_t (&a)[2], uint32_t b0, const int (&c)[4]) {
#ifdef XPACK_UNITS_ON_HOST
  xpack_host_mma_k16(d, a, b0, c);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b0), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#endif
}

// x staged for the products, per 32-input chunk and token: 128 bytes, term j's B
// column at bytes 32 j.. (a pair of tokens is one n8 tile: its 8 columns are token
// 2p's terms 0..3, then token 2p + 1's), each column laid out [c][b0 b1] so that
// lane (g, c) reads its b0, b1 as 8 bytes at 32 g + 8 c of the pair's 256. Unlike
// mxfp4_mmv.cu's (the codes' nibble order), input i of the chunk is k = i: the
// K-quants' quants lie in input order within a word.
__device__ __forceinline__ int b_offset(int i) { return ((i & 15) >> 2) * 8 + (i >> 4) * 4 + (i & 3); }

// Warp-wide: one 256-input block of one token's x (xb: its floats) into the pieces
// of its 8 chunks (piece ch at pieces + ch * stride, 128 bytes each), with one power
// of two for the whole block, its unit 2^(ex - 139) (that of 128 q_k + q_k+1) into
// *unit: the products of a block's chunks then add as integers, and their sums
// become floats once a block. The terms stay within 2^-27 of the block's largest
// |x| (of the chunk's, with a power of two a chunk). With sums (Q3_K's products):
// each term's sum over the block into sums[0..3] (a fixed butterfly; |sum| <= 16384,
// exact as a float).
__device__ __forceinline__ void stage_block(const float* xb, uint8_t* pieces, size_t stride, float* unit,
                                            int* sums = nullptr) {
  const int lane = int(threadIdx.x & 31);
  float xv[8];
  uint32_t big = 0;
#pragma unroll
  for (int ch = 0; ch < 8; ++ch) {
    xv[ch] = xb[32 * ch + lane];
    const uint32_t e = __float_as_uint(xv[ch]) & 0x7F800000u;
    big = e > big ? e : big;
  }
  const unsigned ex = chunk_exponent(__uint_as_float(big));
  const int off = b_offset(lane);
  float ts[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int ch = 0; ch < 8; ++ch) {
    uint32_t q[4];
    int8_terms(xv[ch], ex, q);
    uint8_t* piece = pieces + size_t(ch) * stride;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      piece[32 * j + off] = uint8_t(q[j]);
      ts[j] += float(int(int8_t(uint8_t(q[j]))));
    }
  }
  if (sums) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ts[j] += __shfl_xor_sync(0xFFFFFFFFu, ts[j], o);
      if (lane == 0) sums[j] = int(ts[j]);
    }
  }
  if (lane == 0) *unit = term_unit<7>(ex);
}

// This lane's B fragment of pair p of a staged chunk (chunk: its NT tokens' pieces;
// one token fills columns 0..3 only, lanes 16.. give 0).
template <int NT>
__device__ __forceinline__ uint2 b_fragment(const uint8_t* chunk, int p) {
  const int lane = int(threadIdx.x & 31);
  if (NT > 1 || lane < 16) return *reinterpret_cast<const uint2*>(chunk + p * 256 + lane * 8);
  return make_uint2(0, 0);
}

// Q2_K (84 bytes: 16 scale bytes, scale | min << 4, a 16-input sub-block each; 64
// bytes of quants, input 128 h + 32 s + l at bits 2 s of byte 32 h + l; d and dmin):
// blocks ba (row g) and bb (row g + 8) against every pair p of tokens of their staged
// x (chunk ch's pieces at chunks + ch * stride; units: the block's, per token), added
// into acc[p][0] (row g) and acc[p][1] (row g + 8) for this lane's columns (token 2p +
// c / 2, terms 2 (c % 2) and the next, as 128 d_k + d_k+1 in units of the block's
// unit; terms 2 and 3 weigh 2^-14 of 0 and 1). A is made once for all pairs.
// A holds quant * scale, at most 45: one 32-bit multiply scales a word's 4 bytes
// with no carry between them; a second product takes the sub-block's min as A. Each
// chunk's products add into the last one's (C), |D| <= 45 * 256 * 64 < 2^20, and
// 128 D_k + D_k+1 becomes a float once a block (it may round, as the dp4a units' sums
// do).
template <int NT>
__device__ __forceinline__ void q2k_block(const uint8_t* ba, const uint8_t* bb, const uint8_t* chunks,
                                          size_t stride, const float* units, float (&acc)[(NT + 1) / 2][2],
                                          int live_pairs = (NT + 1) / 2) {
  constexpr int kPairs = (NT + 1) / 2;
  const int lane = int(threadIdx.x & 31), c = lane & 3;
  const uint8_t* blk[2] = {ba, bb};
  int dq[kPairs][4] = {}, dn[kPairs][4] = {};
  // The 16 scale bytes as 4 words (a block starts 4-byte aligned: 84 bytes), not
  // 16 byte loads a row (SASS: 32 LDG.U8 a block).
  uint32_t scw[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) scw[r][i] = ld32(blk[r] + 4 * i);
#pragma unroll
  for (int ch = 0; ch < 8; ++ch) {
    const int h = ch >> 2, s = ch & 3;
    uint32_t aq[4], am[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t q = (ld32(blk[r] + 16 + 32 * h + 16 * half + 4 * c) >> (2 * s)) & 0x03030303u;
        const int sb = 8 * h + 2 * s + half;
        const uint32_t sc = (scw[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu;
        aq[r + 2 * half] = q * (sc & 0xFu);
        am[r + 2 * half] = (sc >> 4) * 0x01010101u;
      }
    }
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      if (p >= live_pairs) continue;  // a problem of fewer tokens than the launch's
      const uint2 b = b_fragment<NT>(chunks + size_t(ch) * stride, p);
      mma_k32(dq[p], aq, b.x, b.y, dq[p]);
      mma_k32(dn[p], am, b.x, b.y, dn[p]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t dd = ld32(blk[r] + 80);
    const float d = h2f(dd), dm = h2f(dd >> 16);
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      if (p >= live_pairs) continue;  // their units and sums were not staged
      const int tok = 2 * p + (c >> 1);
      const float u = units[tok < NT ? tok : NT - 1];
      const float sq = float(dq[p][2 * r] * 128 + dq[p][2 * r + 1]);
      const float sm = float(dn[p][2 * r] * 128 + dn[p][2 * r + 1]);
      acc[p][r] = fmaf(-__fmul_rn(dm, u), sm, fmaf(__fmul_rn(d, u), sq, acc[p][r]));
    }
  }
}

// The 4 bytes at a 2-byte aligned p as one word (Q3_K's blocks are 110 bytes).
__device__ __forceinline__ uint32_t ld32h(const uint8_t* p) { return ld16(p) | ld16(p + 2) << 16; }

// Q3_K (110 bytes: 32 bytes of high bits, input 128 h + 32 s + l at bit 4 h + s of
// byte l; 64 bytes of low bits, at bits 2 s of byte 32 h + l; 12 bytes of 6-bit
// scales e - 32, a 16-input sub-block each; d): blocks ba (row g) and bb (row g + 8)
// against every pair of tokens of their staged x (sums: the block's stage_block
// sums, 4 a token), added into acc as q2k_block's.
// A weight is d (e - 32) q with q = v - 4, v = low + 4 high (0..7). The signed product
// reaches +128 (q = -4, e = 0), which A cannot hold, so with v and e unsigned:
// sum q (e - 32) x = D1 + 8 D2 - 4 D3, three k32 products accumulated in C over the
// block, whose A bytes are carry-free: A1 = v (e & 7) and A2 = v (e >> 3), at most 49,
// and A3 = 8 v + e, at most 119, whose C starts at -32 times the column's block sum
// of x (so D3 = sum (8 v + e - 32) x). |D1|, |D2| < 2^20, |D3| < 2^22, and the sum is
// the exact integer sum q (e - 32) x, below 2^21 in magnitude; 128 D_k + D_k+1 becomes
// a float once a block (it may round, as the dp4a units' sums do).
template <int NT>
__device__ __forceinline__ void q3k_block(const uint8_t* ba, const uint8_t* bb, const uint8_t* chunks,
                                          size_t stride, const float* units, const int* sums,
                                          float (&acc)[(NT + 1) / 2][2], int live_pairs = (NT + 1) / 2) {
  constexpr int kPairs = (NT + 1) / 2;
  const int lane = int(threadIdx.x & 31), c = lane & 3;
  const uint8_t* blk[2] = {ba, bb};
  int d1[kPairs][4] = {}, d2[kPairs][4] = {}, d3[kPairs][4] = {};
  // Each row's 16 codes e (0..63), sub-block sb's in byte sb & 3 of ew[r][sb >> 2],
  // decoded once a block, word by word (ggml's packing: the low 4 bits in byte sb % 8's
  // nibble sb / 8, the high 2 in byte 8 + sb % 4 at bit 2 (sb / 4)). Each A word then
  // takes its code with one byte extract (SASS at eight tokens: 756 loop instructions
  // a block against 783 with a decode a word; at one token 593 against 575).
  uint32_t ew[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t w0 = ld32h(blk[r] + 96), w1 = ld32h(blk[r] + 100), w2 = ld32h(blk[r] + 104);
    ew[r][0] = (w0 & 0x0F0F0F0Fu) | ((w2 << 4) & 0x30303030u);
    ew[r][1] = (w1 & 0x0F0F0F0Fu) | ((w2 << 2) & 0x30303030u);
    ew[r][2] = ((w0 >> 4) & 0x0F0F0F0Fu) | (w2 & 0x30303030u);
    ew[r][3] = ((w1 >> 4) & 0x0F0F0F0Fu) | ((w2 >> 2) & 0x30303030u);
  }
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    if (p >= live_pairs) continue;
    const int tok = 2 * p + (c >> 1), k = 2 * (c & 1);
    const int* st = sums + 4 * (tok < NT ? tok : NT - 1);
    d3[p][0] = d3[p][2] = -32 * st[k];
    d3[p][1] = d3[p][3] = -32 * st[k + 1];
  }
#pragma unroll
  for (int ch = 0; ch < 8; ++ch) {
    const int h = ch >> 2, s = ch & 3;
    uint32_t a1[4], a2[4], a3[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t lo = (ld32h(blk[r] + 32 + 32 * h + 16 * half + 4 * c) >> (2 * s)) & 0x03030303u;
        const uint32_t hi = (ld32h(blk[r] + 16 * half + 4 * c) >> (4 * h + s)) & 0x01010101u;
        const uint32_t v = lo | hi << 2;
        const int sb = 8 * h + 2 * s + half;
        const uint32_t e = (ew[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu;
        a1[r + 2 * half] = v * (e & 7u);
        a2[r + 2 * half] = v * (e >> 3);
        a3[r + 2 * half] = (v << 3) + e * 0x01010101u;
      }
    }
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      if (p >= live_pairs) continue;  // a problem of fewer tokens than the launch's
      const uint2 b = b_fragment<NT>(chunks + size_t(ch) * stride, p);
      mma_k32(d1[p], a1, b.x, b.y, d1[p]);
      mma_k32(d2[p], a2, b.x, b.y, d2[p]);
      mma_k32(d3[p], a3, b.x, b.y, d3[p]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float d = h2f(ld16(blk[r] + 108));
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      if (p >= live_pairs) continue;  // their units and sums were not staged
      const int tok = 2 * p + (c >> 1);
      const float u = units[tok < NT ? tok : NT - 1];
      int sum[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) sum[i] = d1[p][2 * r + i] + 8 * d2[p][2 * r + i] - 4 * d3[p][2 * r + i];
      acc[p][r] = fmaf(__fmul_rn(d, u), float(sum[0] * 128 + sum[1]), acc[p][r]);
    }
  }
}

}  // namespace xpack::kernels::dev::kq
