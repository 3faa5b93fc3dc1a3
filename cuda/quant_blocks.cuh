// Device-side helpers shared by the kernels: loads of block bytes at any
// alignment, exact small-integer -> float conversion, and the exact per-element
// decoders (the same products, in the same order, as ggml's CPU reference; see
// shared/reference/gguf-and-quant-formats.md for the layouts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace xpack::kernels::dev {

__device__ __forceinline__ float h2f(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16 & 0xFFFFu)));
}

__device__ __forceinline__ uint32_t ld32(const uint8_t* p) {  // p 4-byte aligned
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint32_t ld16(const uint8_t* p) {  // p 2-byte aligned
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// N consecutive 32-bit words starting at any byte address: aligned loads and a
// funnel shift. The extra word is read only when p is unaligned, and then it
// holds a byte that is needed, so no load leaves the aligned words of the data.
// With shr (< 8), each word comes shifted right by shr bits more in the same
// funnel shift; its top shr bits are then the next word's or, for the last word
// of aligned data, zeros.
template <int N>
__device__ __forceinline__ void ldwords(const uint8_t* p, uint32_t (&w)[N], unsigned shr = 0) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const unsigned int* base = reinterpret_cast<const unsigned int*>(a & ~uintptr_t(3));
  const unsigned sh = unsigned(a & 3) * 8;
  uint32_t v[N + 1];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = __ldg(base + i);
  v[N] = sh ? __ldg(base + N) : 0u;
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(v[i], v[i + 1], sh + shr);
}

// ldwords' words (N <= 8, p 2-byte aligned) from the 16-byte aligned windows that
// hold them: three 16-byte loads instead of N + 1 of 4 bytes, each of which a warp
// spreads over as many cache lines as the lanes' units span (bench-kernels
// --q3k-wide-loads asks whether that is what holds Q3_K's decode at 67 % of the
// copy: ncu found its L1 85 % busy). The word at p's word offset o (0..3) in the
// window is picked by two selects a word. The windows are the 48 bytes from the
// 16-byte segment that holds p, so the caller's data must reach into the last of
// them: being aligned, it then lies in a page of the data (Q3_K's high bits and
// quants are followed by the rest of their block). The extra word is always the
// next one (ldwords: zeros where p is aligned), which changes only the top shr bits
// of the last word.
template <int N>
__device__ __forceinline__ void ldwords16(const uint8_t* p, uint32_t (&w)[N], unsigned shr = 0) {
  static_assert(N <= 8, "three windows hold at most 8 words and the next from any word offset");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint4* base = reinterpret_cast<const uint4*>(a & ~uintptr_t(15));
  const unsigned o = unsigned(a & 15) >> 2, sh = unsigned(a & 3) * 8;
  uint32_t win[12];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const uint4 v = __ldg(base + k);
    win[4 * k] = v.x;
    win[4 * k + 1] = v.y;
    win[4 * k + 2] = v.z;
    win[4 * k + 3] = v.w;
  }
  uint32_t r[N + 2];
#pragma unroll
  for (int i = 0; i < N + 2; ++i) r[i] = (o & 2) ? win[i + 2] : win[i];
  uint32_t v[N + 1];
#pragma unroll
  for (int i = 0; i < N + 1; ++i) v[i] = (o & 1) ? r[i + 1] : r[i];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(v[i], v[i + 1], sh + shr);
}

// PTX's byte permute in its generic mode: a set msb in a selector nibble
// replicates the selected byte's sign instead (the MXFP4 decoders build a sign
// mask, or a zero for negative codes, with it).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifdef XPACK_UNITS_ON_HOST  // test/cuda/units_on_host: the units run on the CPU
  return xpack_host_prmt(a, b, s);
#else
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#endif
}

// Byte k of v (unsigned, < 256) as the float 2^23 + byte, by placing it in the
// mantissa of 2^23 (one byte permute): `magic_byte(v, k) - (2^23 + bias)` is the
// exact value byte - bias with one FADD and no integer->float conversion.
__device__ __forceinline__ float magic_byte(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u + unsigned(k)));
}
constexpr float kMagic = 8388608.0f;  // 2^23

// 2^n as a float for n in [-126, 127].
__device__ __forceinline__ float pow2(int n) { return __int_as_float((n + 127) << 23); }

// x cut into int8 terms for the integer products (mxfp4_mmv.cu's tensor cores, the
// K-quants' dp4a decode): a warp holds a 32-input chunk of a token's x, one input a
// lane. chunk_exponent is the largest biased exponent among the warp's inputs (255
// where any is inf or NaN); int8_terms cuts x * 2^(132 - ex), whose largest
// magnitude lies below 64, into q0 + q1/2^7 + q2/2^14 + q3/2^21 (each |q| <= 64,
// every step exact in fp32; what is left is below 2^-27 of the chunk's largest
// |x|), each term's int8 in the low byte of q[j].
__device__ __forceinline__ unsigned chunk_exponent(float xv) {
  return __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(xv) & 0x7F800000u) >> 23;
}
__device__ __forceinline__ void int8_terms(float xv, unsigned ex, uint32_t (&q)[4]) {
  const int k = 132 - int(ex), k1 = k >> 1;
  float v = __fmul_rn(__fmul_rn(xv, pow2(k1)), pow2(k - k1));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // v + 1.5 * 2^23 rounds v to an integer q whose low byte is q's int8.
    const float m = __fadd_rn(v, 12582912.0f);
    q[j] = __float_as_uint(m) & 0xFFu;
    v = __fmul_rn(__fsub_rn(v, __fsub_rn(m, 12582912.0f)), 128.0f);
  }
}

// 2^(ex - 132 - kBelow), NaN where ex is 255 (inf or NaN in the chunk): the weight of
// int8_terms' q0 (kBelow 0), or of a finer unit that a sum of several terms carries;
// exact, a subnormal where the exponent is below -126.
template <int kBelow>
__device__ __forceinline__ float term_unit(unsigned ex) {
  constexpr int kBias = 132 + kBelow;
  if (ex == 255) return __int_as_float(0x7FC00000);
  return int(ex) >= kBias - 126 ? __int_as_float((int(ex) - kBias + 127) << 23)
                                : __int_as_float(1 << (int(ex) - kBias + 149));
}

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e-128); e = 0, 1 are f32 subnormals, e = 255 is 2^127.
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
}

// Q4_K/Q5_K scale and min of sub-block j (get_scale_min_k4).
__device__ __forceinline__ void k4_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

__device__ __forceinline__ int q3_k_scale(const uint8_t* s, int j) {
  const int lo4 = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int hi2 = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
  return (lo4 | (hi2 << 4)) - 32;
}

__device__ __forceinline__ float ldh(const uint8_t* p) { return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8)))); }

static __constant__ int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Element i (0..block_elems-1) of the block at b, exactly as the CPU reference
// computes it (explicit _rn operations: no FMA contraction).
template <uint32_t T>
__device__ __forceinline__ float dequant_elem(const uint8_t* b, int i);

template <>
__device__ __forceinline__ float dequant_elem<0>(const uint8_t* b, int) {  // F32
  return __uint_as_float(uint32_t(b[0]) | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) |
                         (uint32_t(b[3]) << 24));
}
template <>
__device__ __forceinline__ float dequant_elem<1>(const uint8_t* b, int) {  // F16
  return ldh(b);
}
template <>
__device__ __forceinline__ float dequant_elem<30>(const uint8_t* b, int) {  // BF16
  return __uint_as_float((uint32_t(b[0]) | (uint32_t(b[1]) << 8)) << 16);
}
template <>
__device__ __forceinline__ float dequant_elem<8>(const uint8_t* b, int i) {  // Q8_0
  return __fmul_rn(float(int8_t(b[2 + i])), ldh(b));
}
template <>
__device__ __forceinline__ float dequant_elem<10>(const uint8_t* b, int i) {  // Q2_K
  const int h = i >> 7, g = (i >> 5) & 3, l = i & 31;
  const uint8_t s = b[i >> 4];
  const float dl = __fmul_rn(ldh(b + 80), float(s & 0xF));
  const float ml = __fmul_rn(ldh(b + 82), float(s >> 4));
  return __fsub_rn(__fmul_rn(dl, float((b[16 + 32 * h + l] >> (2 * g)) & 3)), ml);
}
template <>
__device__ __forceinline__ float dequant_elem<11>(const uint8_t* b, int i) {  // Q3_K
  const int h = i >> 7, g = (i >> 5) & 3, l = i & 31;
  const int low = (b[32 + 32 * h + l] >> (2 * g)) & 3;
  const int q = low - (((b[l] >> (4 * h + g)) & 1) ? 0 : 4);
  const float dl = __fmul_rn(ldh(b + 108), float(q3_k_scale(b + 96, i >> 4)));
  return __fmul_rn(dl, float(q));
}
template <>
__device__ __forceinline__ float dequant_elem<12>(const uint8_t* b, int i) {  // Q4_K
  const int j = i >> 5, l = i & 31;
  int sc, m;
  k4_scale_min(b + 4, j, sc, m);
  const float d1 = __fmul_rn(ldh(b), float(sc));
  const float m1 = __fmul_rn(ldh(b + 2), float(m));
  const int q = (b[16 + 32 * (j >> 1) + l] >> (4 * (j & 1))) & 0xF;
  return __fsub_rn(__fmul_rn(d1, float(q)), m1);
}
template <>
__device__ __forceinline__ float dequant_elem<13>(const uint8_t* b, int i) {  // Q5_K
  const int j = i >> 5, l = i & 31;
  int sc, m;
  k4_scale_min(b + 4, j, sc, m);
  const float d1 = __fmul_rn(ldh(b), float(sc));
  const float m1 = __fmul_rn(ldh(b + 2), float(m));
  const int q = ((b[48 + 32 * (j >> 1) + l] >> (4 * (j & 1))) & 0xF) + (((b[16 + l] >> j) & 1) ? 16 : 0);
  return __fsub_rn(__fmul_rn(d1, float(q)), m1);
}
template <>
__device__ __forceinline__ float dequant_elem<14>(const uint8_t* b, int i) {  // Q6_K
  const int h = i >> 7, r = i & 127, g = r >> 5, l = r & 31;
  const uint8_t lb = b[64 * h + l + 32 * (g & 1)];
  const int lo4 = g < 2 ? (lb & 0xF) : (lb >> 4);
  const int hi2 = (b[128 + 32 * h + l] >> (2 * g)) & 3;
  const int q = (lo4 | (hi2 << 4)) - 32;
  const float dsc = __fmul_rn(ldh(b + 208), float(int8_t(b[192 + 8 * h + 2 * g + (l >> 4)])));
  return __fmul_rn(dsc, float(q));
}
template <>
__device__ __forceinline__ float dequant_elem<39>(const uint8_t* b, int i) {  // MXFP4
  const uint8_t q = b[1 + (i & 15)];
  const int code = i < 16 ? (q & 0xF) : (q >> 4);
  return __fmul_rn(float(kMxfp4[code]), e8m0_half(b[0]));
}

}  // namespace xpack::kernels::dev
