// The decode kernel's units (quant_matvec.cu): for each GGUF type, how a lane
// turns a unit of a row's bytes (a block, or the part of a block whose quant
// bytes belong together) into that unit's products with R rows' x for NT tokens,
// accumulated in fixed order. Integer quants become exact floats in the mantissa
// of 2^23 (byte permute + one FADD); sub-block scales multiply sub-block sums.
// Types that load ahead (TMXFP4) split this into load() and compute().
#pragma once

#include <cstdint>
#include <type_traits>

#include "quant_blocks.cuh"

namespace xpack::kernels::dev {
// x is read from shared memory (staged) or from global memory: a plain load,
// which the compiler turns into LDS or LDG as the pointer's origin says.
__device__ __forceinline__ float4 ldx(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ uint4 ld128(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// Four exact floats byte_k(v) - bias.
__device__ __forceinline__ void unpack4(uint32_t v, float bias, float (&f)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) f[k] = magic_byte(v, k) - (kMagic + bias);
}
__device__ __forceinline__ float dot4(const float (&f)[4], const float4& x, float s) {
  s = fmaf(f[0], x.x, s);
  s = fmaf(f[1], x.y, s);
  s = fmaf(f[2], x.z, s);
  return fmaf(f[3], x.w, s);
}
__device__ __forceinline__ float sum4(const float4& x) { return (x.x + x.y) + (x.z + x.w); }

// Byte idx (run-time, < 12) of 12 bytes held in 3 words, without indexing a
// register array at run time (which would put it in local memory).
__device__ __forceinline__ int byte12(const uint32_t (&s)[3], int idx) {
  const int w = idx >> 2;
  const uint32_t word = w == 0 ? s[0] : (w == 1 ? s[1] : s[2]);
  return int((word >> (8 * (idx & 3))) & 0xFFu);
}

// Q3_K's signed 6-bit scale of sub-block j = 8h + sb (scales[12] in sc): its low 4
// bits are byte sb's nibble h, the high 2 bits are in byte 8 + (j & 3) at shift 2 * (j >> 2).
__device__ __forceinline__ int q3k_scale(const uint32_t (&sc)[3], int sb, int h) {
  const int lo4 = (byte12(sc, sb) >> (4 * h)) & 0xF;
  const int hi2 = (byte12(sc, 8 + (sb & 3)) >> (2 * (2 * h + (sb >> 2)))) & 3;
  return (lo4 | (hi2 << 4)) - 32;
}

// Q4_K's and Q5_K's block head: d, dmin and the 12 bytes of 6-bit scales and mins,
// one 16-byte load (the blocks are 144 and 176 bytes: 16-byte aligned).
__device__ __forceinline__ void k4_head(const uint8_t* b, float& d, float& dm, uint32_t (&sc)[3]) {
  const uint4 a = ld128(b);
  d = h2f(a.x);
  dm = h2f(a.x >> 16);
  sc[0] = a.y;
  sc[1] = a.z;
  sc[2] = a.w;
}
// Sub-block j's (0..7) scale and min, 6 bits each, from the 12 bytes (ggml's
// get_scale_min_k4).
__device__ __forceinline__ void k4_scale_min(const uint32_t (&sc)[3], int j, int& s, int& m) {
  if (j < 4) {
    s = byte12(sc, j) & 63;
    m = byte12(sc, j + 4) & 63;
  } else {
    s = (byte12(sc, j + 4) & 0xF) | ((byte12(sc, j - 4) >> 6) << 4);
    m = (byte12(sc, j + 4) >> 4) | ((byte12(sc, j) >> 6) << 4);
  }
}

template <int NT, int R>
using Acc = float[R][NT];

// ---- float types ------------------------------------------------------------

// F32, 16-byte aligned rows, ne0 % 8 == 0. kVariant 0: units of 8 floats (32
// bytes), two plain loads a row (57 % of the copy bandwidth above the L2, where
// F16 read at 104 %); 1, the same units through the read-only path (__ldg, as
// every other type's weights; the same bits); 2, units of 4 floats, one __ldg a
// row, so that a warp's load is 512 contiguous bytes as F16's is (a lane's sum
// then adds its floats in another order: other bits, within the same bound).
// Which one a launch takes: quant_matvec.cu, f32_unit.
template <int kVariant>
struct TF32V {
  static constexpr int kUnit = kVariant == 2 ? 4 : 8;
  static constexpr int kVecs = kUnit / 4;
  __device__ static float4 ldw(const float* p) {
    if constexpr (kVariant == 0) return ldx(p);
    else return __ldg(reinterpret_cast<const float4*>(p));
  }
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    float4 w[R][kVecs];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float* p = reinterpret_cast<const float*>(rp[r]) + kUnit * u;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) w[r][k] = ldw(p + 4 * k);
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4 xv = ldx(xp[t] + xs * u + 4 * k);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float f[4] = {w[r][k].x, w[r][k].y, w[r][k].z, w[r][k].w};
          acc[r][t] = dot4(f, xv, acc[r][t]);
        }
      }
    }
  }
};
using TF32 = TF32V<0>;

template <bool kBf16>
struct THalf {  // F16 or BF16, 8 elements (16 bytes) per unit
  static constexpr int kUnit = 8;
  __device__ static void to_f(uint32_t w, float& a, float& b) {
    if (kBf16) {
      a = __uint_as_float(w << 16);
      b = __uint_as_float(w & 0xFFFF0000u);
    } else {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w));
      a = v.x;
      b = v.y;
    }
  }
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    float w[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 q = ld128(rp[r] + 16 * size_t(u));
      to_f(q.x, w[r][0], w[r][1]);
      to_f(q.y, w[r][2], w[r][3]);
      to_f(q.z, w[r][4], w[r][5]);
      to_f(q.w, w[r][6], w[r][7]);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4 xv = ldx(xp[t] + xs * u + 4 * k);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float f[4] = {w[r][4 * k], w[r][4 * k + 1], w[r][4 * k + 2], w[r][4 * k + 3]};
          acc[r][t] = dot4(f, xv, acc[r][t]);
        }
      }
    }
  }
};

// One element per unit: float types whose rows are not whole 16-byte vectors.
template <uint32_t kType>
struct TScalar {
  static constexpr int kUnit = 1;
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    constexpr int kBytes = kType == 0 ? 4 : 2;
    float w[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = rp[r] + size_t(u) * kBytes;
      if (kType == 0) w[r] = __uint_as_float(ld32(p));
      else if (kType == 1) w[r] = h2f(ld16(p));
      else w[r] = __uint_as_float(ld16(p) << 16);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float xv = xp[t][xs * u];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] = fmaf(w[r], xv, acc[r][t]);
    }
  }
};

// ---- Q8_0: one 34-byte block per unit ------------------------------------------

struct TQ8_0 {
  static constexpr int kUnit = 32;
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    uint32_t q[R][8];
    float d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(u) * 34;
      d[r] = h2f(ld16(b));
      ldwords<8>(b + 2, q[r]);
    }
    float s1[R][NT] = {};
    const int e = xs * u;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float4 xv[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) xv[t] = ldx(xp[t] + e + 4 * k);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float f[4];
        unpack4(q[r][k] ^ 0x80808080u, 128.0f, f);  // int8 -> unsigned byte + 128
#pragma unroll
        for (int t = 0; t < NT; ++t) s1[r][t] = dot4(f, xv[t], s1[r][t]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(d[r], s1[r][t], acc[r][t]);
  }
};

// ---- MXFP4: one 17-byte block per unit -------------------------------------------

struct TMXFP4 {
  static constexpr int kUnit = 32;
  // Eight codes of a 32-bit word w (nibbles of bytes 4k..4k+3) as exact floats
  // kvalue(code), in the order (4k, 4k+16, 4k+1, 4k+17, 4k+2, 4k+18, 4k+3, 4k+19).
  // kvalue + 12 (0..24) comes from two byte tables by the code's low 3 bits (one
  // for each sign); the sign bits pick between them.
  __device__ static void decode(uint32_t w, float (&f)[8]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t ww = half ? (w >> 16) : w;
      const uint32_t sel = ww & 0x7777u;
      const uint32_t pos = prmt(0x0F0E0D0Cu, 0x18141210u, sel);  // 12 + {0,1,2,3,4,6,8,12}
      const uint32_t neg = prmt(0x090A0B0Cu, 0x00040608u, sel);  // 12 - {0,1,2,3,4,6,8,12}
      // 0xFF where the code is negative, 0x80 elsewhere (values are < 0x80).
      const uint32_t m = prmt(0x80808080u, 0u, (ww & 0x8888u) | 0x3210u);
      const uint32_t v = (neg & m) | (pos & ~m);
#pragma unroll
      for (int k = 0; k < 4; ++k) f[4 * half + k] = magic_byte(v, k) - (kMagic + 12.0f);
    }
  }
  // A unit's bytes as loaded: the five aligned words that hold a row's 17-byte
  // block (whatever its offset, each of them holds one of its bytes, so no load
  // leaves the block's aligned words).
  template <int R>
  struct Raw {
    uint32_t v[R][5];
  };
  template <int R>
  __device__ static void load(const uint8_t* const (&rp)[R], int u, Raw<R>& raw) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(rp[r] + size_t(u) * 17);
      const unsigned int* base = reinterpret_cast<const unsigned int*>(a & ~uintptr_t(3));
#pragma unroll
      for (int i = 0; i < 5; ++i) raw.v[r][i] = __ldg(base + i);
    }
  }
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    Raw<R> raw;
    load<R>(rp, u, raw);
    compute<NT, R>(rp, raw, u, xp, acc, xs);
  }
  template <int NT, int R>
  __device__ static void compute(const uint8_t* const (&rp)[R], const Raw<R>& raw, int u,
                                 const float* const (&xp)[NT], Acc<NT, R>& acc, int xs) {
    uint32_t q[R][4];
    float sc[R];
    bool big[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // The block starts at byte `at` of its first word: the scale, then the codes.
      const unsigned at = unsigned(reinterpret_cast<uintptr_t>(rp[r] + size_t(u) * 17) & 3u);
      const uint32_t e = (raw.v[r][0] >> (8 * at)) & 0xFFu;
      sc[r] = e8m0_half(e);
      // From e = 253 on, kvalue * 2^(e-128) can overflow to inf, as on the CPU;
      // only there the weights are formed one by one to give the CPU's inf/NaN.
      big[r] = e >= 253;
#pragma unroll
      for (int i = 0; i < 4; ++i) q[r][i] = __funnelshift_rc(raw.v[r][i], raw.v[r][i + 1], 8 * (at + 1));
    }
    float s1[R][NT] = {};
    const int e0 = xs * u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float4 xl[NT], xh[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xl[t] = ldx(xp[t] + e0 + 4 * k);
        xh[t] = ldx(xp[t] + e0 + 16 + 4 * k);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float f[8];
        decode(q[r][k], f);
        if (big[r]) {
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] = __fmul_rn(f[i], sc[r]);
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float s = s1[r][t];
          s = fmaf(f[0], xl[t].x, s);
          s = fmaf(f[1], xh[t].x, s);
          s = fmaf(f[2], xl[t].y, s);
          s = fmaf(f[3], xh[t].y, s);
          s = fmaf(f[4], xl[t].z, s);
          s = fmaf(f[5], xh[t].z, s);
          s = fmaf(f[6], xl[t].w, s);
          s1[r][t] = fmaf(f[7], xh[t].w, s);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        acc[r][t] = big[r] ? acc[r][t] + s1[r][t] : fmaf(sc[r], s1[r][t], acc[r][t]);
  }
};

// ---- Q2_K: half a 84-byte block (128 elements) per unit ------------------------------

struct TQ2_K {
  static constexpr int kUnit = 128;
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t sc[R][2], q[R][8];
    float d[R], dm[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * 84;  // 4-byte aligned
      sc[r][0] = ld32(b + 8 * h);
      sc[r][1] = ld32(b + 8 * h + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[r][i] = ld32(b + 16 + 32 * h + 4 * i);
      const uint32_t dd = ld32(b + 80);
      d[r] = h2f(dd);
      dm[r] = h2f(dd >> 16);
    }
    const int e0 = xs * u;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const int e = e0 + 32 * g + 16 * half;
        float s1[R][NT] = {}, sx[NT] = {};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float4 xv[NT];
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            xv[t] = ldx(xp[t] + e + 4 * k);
            sx[t] += sum4(xv[t]);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float f[4];
            unpack4((q[r][4 * half + k] >> (2 * g)) & 0x03030303u, 0.0f, f);
#pragma unroll
            for (int t = 0; t < NT; ++t) s1[r][t] = dot4(f, xv[t], s1[r][t]);
          }
        }
        const int sb = 2 * g + half;  // scale byte within this half block
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t s = (sc[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu;
          const float dl = d[r] * float(s & 0xF);
          const float ml = dm[r] * float(s >> 4);
#pragma unroll
          for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(-ml, sx[t], fmaf(dl, s1[r][t], acc[r][t]));
        }
      }
    }
  }
};

// ---- the K-quants on dp4a: x staged as int8 terms ----------------------------------
//
// TQ2_K and TQ3_K spend 4.8 and about 6 instructions a weight in their one-token
// loops (SASS, doc/kernels.md: "What a K-quant unit costs"), which bounds them by
// issue below half the copy bandwidth. Here each token's x is staged as int8 terms
// (int8_terms: per 32-input chunk, q0 + q1/2^7 + q2/2^14 + q3/2^21 times the chunk's
// power of two) with each chunk's power of two and each 16-input sub-block's sum of
// x (fp32, a fixed butterfly); a row's quants become unsigned bytes and meet each
// term in dp4a, exactly in int32; each sub-block's scale, and its min or offset
// times the sum of x, apply once, as in the FMA units.

// dp4a with unsigned bytes in a (a K-quant's masked quants, up to 192) and signed
// bytes in b (x's terms); CUDA's __dp4a takes both signed or both unsigned.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
#ifdef XPACK_UNITS_ON_HOST  // test/cuda/units_on_host: the units run on the CPU
  return xpack_host_dp4a_us(a, b, c);
#else
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#endif
}

// dp4a with signed bytes in both (MXFP4's codes as their values, x's terms).
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
#ifdef XPACK_UNITS_ON_HOST
  return xpack_host_dp4a_ss(a, b, c);
#else
  return __dp4a(int(a), int(b), c);
#endif
}

// x staged as int8 terms for the K-quants' dp4a units of 128 inputs. Per
// unit and token (kXs floats, 560 bytes, 16-byte aligned; the lanes of a row group
// read at a stride of one unit, 140 words, so 8 lanes' 16-byte reads fall in 8
// different bank groups): the 4 chunks' terms, chunk g's term k at byte 128 g + 32 k
// (one byte an input), then the chunks' scales 2^(ex - 139) (4 floats), then the 8
// 16-input sub-blocks' sums of x.
// The base of the units that read x staged as int8 terms (the kernel stages them
// with Ty::stage_chunk, kChunks 32-input chunks a unit).
struct TermsX {
  // Sum over the 32 inputs of chunk g of a staged unit for one token (v: 8 words of
  // bytes, inputs in the order of the terms; tv: the chunk's terms, terms32) as
  // (a + b 2^-14) with a = 128 s0 + s1, b = 128 s2 + s3, times the chunk's scale by
  // the caller. v's bytes unsigned (the K-quants' masked quants, < 256) or, with
  // kSigned, signed (MXFP4's values, -12..12); terms <= 64 in magnitude, so
  // |a|, |b| < 2^27: exact in int32. One float conversion a chunk.
  template <bool kSigned = false>
  __device__ __forceinline__ static float dot32(const uint32_t (&v)[8], const uint4 (&tv)[4][2]) {
    int a = 0, b = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      int& s = k < 2 ? a : b;
      if (k & 1) s <<= 7;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        s = kSigned ? dp4a_ss(v[4 * hf + 0], tv[k][hf].x, s) : dp4a_us(v[4 * hf + 0], tv[k][hf].x, s);
        s = kSigned ? dp4a_ss(v[4 * hf + 1], tv[k][hf].y, s) : dp4a_us(v[4 * hf + 1], tv[k][hf].y, s);
        s = kSigned ? dp4a_ss(v[4 * hf + 2], tv[k][hf].z, s) : dp4a_us(v[4 * hf + 2], tv[k][hf].z, s);
        s = kSigned ? dp4a_ss(v[4 * hf + 3], tv[k][hf].w, s) : dp4a_us(v[4 * hf + 3], tv[k][hf].w, s);
      }
    }
    return fmaf(float(b), 0x1p-14f, float(a));
  }
  // The 4 terms of chunk g of a staged unit (xu: its floats; term k at byte 128 g + 32 k).
  __device__ __forceinline__ static void terms32(const float* xu, int g, uint4 (&tv)[4][2]) {
    const uint8_t* terms = reinterpret_cast<const uint8_t*>(xu) + 128 * g;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) tv[k][hf] = *reinterpret_cast<const uint4*>(terms + 32 * k + 16 * hf);
  }
};

struct Terms128 : TermsX {
  static constexpr int kUnit = 128;
  static constexpr int kChunks = 4;
  static constexpr int kXs = 140;
  static constexpr int kScales = 128;  // floats: the chunks' scales, then the sums
  static constexpr int kSums = 132;

  // Warp-wide: turns chunk g of a staged unit `u` (one token's), whose 32 floats
  // were copied to bytes 128 g.. (the 128 bytes its terms take), into its terms,
  // scale and sums. Lane i takes input i.
  __device__ static void stage_chunk(uint8_t* u, int g) {
    const int lane = int(threadIdx.x & 31);
    const float xv = reinterpret_cast<const float*>(u + 128 * g)[lane];
    const unsigned ex = chunk_exponent(xv);
    uint32_t q[4];
    int8_terms(xv, ex, q);
    __syncwarp();  // every lane has read its float before the chunk is overwritten
#pragma unroll
    for (int k = 0; k < 4; ++k) u[128 * g + 32 * k + lane] = uint8_t(q[k]);
    float sx = xv;  // the sub-block's sum: lanes 0-15 and 16-31, every lane the same bits
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) sx += __shfl_xor_sync(0xFFFFFFFFu, sx, off);
    float* f = reinterpret_cast<float*>(u);
    if ((lane & 15) == 0) f[kSums + 2 * g + (lane >> 4)] = sx;
    // 2^(ex - 139): q0's scale 2^(ex - 132) over the 2^7 that a pair of terms carries.
    if (lane == 0) f[kScales + g] = term_unit<7>(ex);
  }

  // Sum over 16 inputs (sub-block half of chunk g) of v * x for one token, where the
  // 4 words of v hold unsigned bytes v * 2^m (m: the caller's) and tv the 16 inputs'
  // 4 terms: (a + b 2^-14) with a = 128 s0 + s1, b = 128 s2 + s3 (|a|, |b| < 2^25,
  // exact in int32), times 2^m and the chunk's scale by the caller.
  __device__ __forceinline__ static float dot16(const uint32_t (&v)[4], const uint4 (&tv)[4]) {
    int a, b;
    dot16i(v, tv, a, b);
    return fmaf(float(b), 0x1p-14f, float(a));
  }
  // dot16's a and b, before they become a float.
  __device__ __forceinline__ static void dot16i(const uint32_t (&v)[4], const uint4 (&tv)[4], int& a, int& b) {
    a = 0;
    b = 0;
    a = dp4a_us(v[0], tv[0].x, a);
    a = dp4a_us(v[1], tv[0].y, a);
    a = dp4a_us(v[2], tv[0].z, a);
    a = dp4a_us(v[3], tv[0].w, a);
    a <<= 7;
    a = dp4a_us(v[0], tv[1].x, a);
    a = dp4a_us(v[1], tv[1].y, a);
    a = dp4a_us(v[2], tv[1].z, a);
    a = dp4a_us(v[3], tv[1].w, a);
    b = dp4a_us(v[0], tv[2].x, b);
    b = dp4a_us(v[1], tv[2].y, b);
    b = dp4a_us(v[2], tv[2].z, b);
    b = dp4a_us(v[3], tv[2].w, b);
    b <<= 7;
    b = dp4a_us(v[0], tv[3].x, b);
    b = dp4a_us(v[1], tv[3].y, b);
    b = dp4a_us(v[2], tv[3].z, b);
    b = dp4a_us(v[3], tv[3].w, b);
  }

  // Chunk g of a staged unit (one token) against R rows' values (v: each half's 4
  // words of bytes, as dot16i takes them), each 16-input half's sums times its
  // integer scale sl, summed over the two halves: (ia + ib 2^-14) times the
  // caller's factors. The caller bounds |sl| so that the sums stay in int32.
  template <int R>
  __device__ __forceinline__ static void chunk_sums(const float* xu, int g, const uint32_t (&v)[R][2][4],
                                                    const int (&sl)[R][2], int (&ia)[R], int (&ib)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) ia[r] = ib[r] = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 tv[4];
      terms16(xu, g, half, tv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        int a, b;
        dot16i(v[r][half], tv, a, b);
        ia[r] += a * sl[r][half];
        ib[r] += b * sl[r][half];
      }
    }
  }

  // The 4 terms of inputs 16 half.. of chunk g of a staged unit (xu: its floats).
  __device__ __forceinline__ static void terms16(const float* xu, int g, int half, uint4 (&tv)[4]) {
    const uint8_t* terms = reinterpret_cast<const uint8_t*>(xu) + 128 * g + 16 * half;
#pragma unroll
    for (int k = 0; k < 4; ++k) tv[k] = *reinterpret_cast<const uint4*>(terms + 32 * k);
  }
};

// Q2_K: the 2-bit quants masked in place (quant * 4^g in each byte: one LOP3 a 4
// weights); a 32-input chunk's two sub-blocks summed as integers, each times its
// 4-bit scale (|a| < 2^25 a sub-block, times 15, two of them: < 2^30, exact in
// int32), then one conversion, one multiply by d and the chunk's scale, and the two
// mins against the staged sums of x. 2.55 instructions a weight in the one-token
// loop (sm_90 SASS), against 2.75 when each sub-block's sum became a float and 4.8
// for TQ2_K.
struct TQ2_K8 : Terms128 {
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t sc[R][2], q[R][8];
    float d[R], dm[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * 84;  // 4-byte aligned
      sc[r][0] = ld32(b + 8 * h);
      sc[r][1] = ld32(b + 8 * h + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[r][i] = ld32(b + 16 + 32 * h + 4 * i);
      const uint32_t dd = ld32(b + 80);
      d[r] = h2f(dd);
      dm[r] = h2f(dd >> 16);
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      int sl[R][2];
      float m[R][2];
      uint32_t qw[R][2][4];  // the chunk's quants masked in place, a half (sub-block) each
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int sb = 2 * g + half;  // scale byte within this half block
          const uint32_t s = (sc[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu;
          sl[r][half] = int(s & 0xF);
          m[r][half] = float(s >> 4);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) qw[r][j >> 2][j & 3] = q[r][j] & (0x03030303u << (2 * g));
      }
      // Token by token, so that few sums are live at once (8 tokens' of all
      // rows spilled); each token's operations are the same at any token count.
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xu = xp[t] + xs * u;
        int ia[R], ib[R];
        chunk_sums<R>(xu, g, qw, sl, ia, ib);
        const float cs = xu[kScales + g] * (1.0f / float(1 << (2 * g)));
        const float sx0 = xu[kSums + 2 * g], sx1 = xu[kSums + 2 * g + 1];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float sum = fmaf(float(ib[r]), 0x1p-14f, float(ia[r]));
          const float mx = fmaf(m[r][1], sx1, m[r][0] * sx0);
          acc[r][t] = fmaf(-dm[r], mx, fmaf(d[r] * cs, sum, acc[r][t]));
        }
      }
    }
  }
};

// Q3_K: each weight's 2 low bits and high bit make the unsigned byte v = low + 4 hb
// (0..7), so the weight is scale * (v - 4) and a sub-block's sum is
// scale * (sum v x - 4 sum x), the second with the staged sum of x. Chunk g's v
// are masked in place, v * 2^m with m = 0, 2, 4, 4: the low bits where they lie
// (for g = 3 two places down, so that the high bit fits in the byte) and the high
// bit moved beside them, three instructions a 4 weights. The half block's 8
// scales (+ 32) are decoded as bytes of two words at once. As in TQ2_K8, a
// chunk's two sub-blocks are summed as integers, each times its signed scale
// (v * 2^m <= 112, terms <= 64: |a| < 129 * 16 * 112 * 64 < 2^24 a sub-block,
// times 32, two of them: < 2^30, exact in int32), then one conversion.
// kWide: the high bits and quants through ldwords16 (bench-kernels --q3k-wide-loads;
// the same words, so the same bits).
template <bool kWide>
struct TQ3_K8T : Terms128 {
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t hm[R][8], q[R][8], s8[R][2];  // s8: sub-block sb's scale + 32 in byte sb & 3 of word sb >> 2
    float d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * 110;  // 2-byte aligned
      const int sh = 4 * h;
      uint32_t sc[3];
      // The second half block's high bits are bits 4..7 of each byte: shifted down
      // as they load, so that chunk g's are bit g (bits 4..7 are not used).
      if constexpr (kWide) {
        ldwords16<8>(b, hm[r], sh);
        ldwords16<8>(b + 32 + 32 * h, q[r]);
      } else {
        ldwords<8>(b, hm[r], sh);
        ldwords<8>(b + 32 + 32 * h, q[r]);
      }
      ldwords<3>(b + 96, sc);
      d[r] = h2f(ld16(b + 108));
      // Sub-block j = 8h + sb: low 4 bits in byte sb's nibble h, high 2 bits in byte
      // 8 + (sb & 3) at shift 4h (sb < 4) or 4h + 2 (q3k_scale).
      const uint32_t hi = sc[2] >> sh;
      s8[r][0] = ((sc[0] >> sh) & 0x0F0F0F0Fu) | ((hi << 4) & 0x30303030u);
      s8[r][1] = ((sc[1] >> sh) & 0x0F0F0F0Fu) | ((hi << 2) & 0x30303030u);
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      constexpr int kM[4] = {0, 2, 4, 4};
      int sl[R][2];
      float slf[R][2];
      uint32_t v[R][2][4];  // the chunk's v * 2^m, a half (sub-block) each
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          sl[r][half] = int((s8[r][g >> 1] >> (16 * (g & 1) + 8 * half)) & 0xFFu) - 32;
          slf[r][half] = float(sl[r][half]);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t qw = q[r][j], hw = hm[r][j];
          v[r][j >> 2][j & 3] = g < 3 ? (qw & (0x03030303u << (2 * g))) | ((hw << (g + 2)) & (0x04040404u << (2 * g)))
                                      : ((qw >> 2) & 0x30303030u) | ((hw << 3) & 0x40404040u);
        }
      }
      // Token by token, as TQ2_K8.
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xu = xp[t] + xs * u;
        int ia[R], ib[R];
        chunk_sums<R>(xu, g, v, sl, ia, ib);
        const float cs = xu[kScales + g] * (1.0f / float(1 << kM[g]));
        const float sx0 = xu[kSums + 2 * g], sx1 = xu[kSums + 2 * g + 1];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float sum = fmaf(float(ib[r]), 0x1p-14f, float(ia[r]));
          const float off = fmaf(slf[r][1], sx1, slf[r][0] * sx0);
          acc[r][t] = fmaf(-4.0f * d[r], off, fmaf(d[r] * cs, sum, acc[r][t]));
        }
      }
    }
  }
};
using TQ3_K8 = TQ3_K8T<false>;
using TQ3_K8W = TQ3_K8T<true>;

// x staged as int8 terms for MXFP4's dp4a unit (one 32-input block a unit). Per
// unit and token (kXs floats, 144 bytes; a stride of 36 words puts 8 lanes' 16-byte
// reads in 8 different bank groups): term k at bytes 32 k.., its inputs in the
// order their codes lie in the block's words (byte 8 j + n: the code in nibble n of
// word j, input 4 j + n / 2 + 16 (n % 2)), so a word's decoded codes meet their
// terms without a byte permute; then the chunk's scale 2^(ex - 139).
struct Terms32 : TermsX {
  static constexpr int kUnit = 32;
  static constexpr int kChunks = 1;
  static constexpr int kXs = 36;
  static constexpr int kScales = 32;

  // Warp-wide, as Terms128::stage_chunk (g is 0).
  __device__ static void stage_chunk(uint8_t* u, int) {
    const int lane = int(threadIdx.x & 31);
    const float xv = reinterpret_cast<const float*>(u)[lane];
    const unsigned ex = chunk_exponent(xv);
    uint32_t q[4];
    int8_terms(xv, ex, q);
    __syncwarp();  // every lane has read its float before the chunk is overwritten
    const int at = 8 * ((lane & 15) >> 2) + 2 * (lane & 3) + (lane >> 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) u[32 * k + at] = uint8_t(q[k]);
    if (lane == 0) reinterpret_cast<float*>(u)[kScales] = term_unit<7>(ex);
  }
};

// MXFP4 on dp4a: each word's 8 codes become their values (int8, -12..12) in nibble
// order, which meet their terms in signed dp4a; the block's E8M0 scale and the
// chunk's multiply once. Blocks of E8M0 >= 253, whose ggml weights can overflow to
// inf, are summed weight by weight against x rebuilt from its terms (big_block).
struct TMXFP4_8 : Terms32 {
  // The 8 codes of w as int8 values in nibble order (v0: nibbles 0-3, v1: 4-7), by
  // byte tables of the positive and the negative values, each code's sign bit
  // choosing between them (a byte permute reads the low 16 bits of its selector).
  __device__ static void values8(uint32_t w, uint32_t& v0, uint32_t& v1) {
    const uint32_t sel = w & 0x77777777u;
    const uint32_t pick = ((w >> 1) & 0x44444444u) | 0x32103210u;  // byte n from neg where nibble n >= 8
    const uint32_t sel1 = sel >> 16, pick1 = pick >> 16;
    v0 = prmt(prmt(0x03020100u, 0x0C080604u, sel), prmt(0xFDFEFF00u, 0xF4F8FAFCu, sel), pick);
    v1 = prmt(prmt(0x03020100u, 0x0C080604u, sel1), prmt(0xFDFEFF00u, 0xF4F8FAFCu, sel1), pick1);
  }
  // A unit with a block of E8M0 >= 253 in any of its rows, whose ggml weights
  // (kvalue times 2^(e-128) in fp32) can overflow to inf: each row's block (at
  // blk) weight by weight against x as its terms give it (within 2^-24 of x),
  // added to acc. The rare path, a function of its own taking only scalars, so
  // that the unit's code keeps none of it.
  __device__ __noinline__ static float big_block(const uint8_t* blk, const float* xu, float acc) {
    const uint32_t e = blk[0];
    const float sc = e8m0_half(e);
    const bool big = e >= 253;
    const uint8_t* terms = reinterpret_cast<const uint8_t*>(xu);
    const float xsc = xu[kScales];  // 2^(ex - 139): the terms' integer below over 2^14 more
    float s = 0.0f;
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = uint32_t(blk[1 + 4 * j]) | (uint32_t(blk[2 + 4 * j]) << 8) |
                         (uint32_t(blk[3 + 4 * j]) << 16) | (uint32_t(blk[4 + 4 * j]) << 24);
      float f[8];
      TMXFP4::decode(w, f);
      for (int n = 0; n < 8; ++n) {
        const int at = 8 * j + n;
        const int xi =
            ((int(int8_t(terms[at])) * 128 + int8_t(terms[32 + at])) * 128 + int8_t(terms[64 + at])) * 128 +
            int8_t(terms[96 + at]);
        const float xr = __fmul_rn(__fmul_rn(float(xi), 0x1p-14f), xsc);
        s = big ? fmaf(__fmul_rn(f[n], sc), xr, s) : fmaf(f[n], xr, s);
      }
    }
    return big ? acc + s : fmaf(sc, s, acc);
  }
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    uint32_t q[R][4];
    float sc[R];
    bool big = false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(rp[r] + size_t(u) * 17);
      const unsigned int* base = reinterpret_cast<const unsigned int*>(a & ~uintptr_t(3));
      const unsigned at = unsigned(a & 3u);
      uint32_t v[5];
#pragma unroll
      for (int i = 0; i < 5; ++i) v[i] = __ldg(base + i);
      const uint32_t e = (v[0] >> (8 * at)) & 0xFFu;
      sc[r] = e8m0_half(e);
      big |= e >= 253;
#pragma unroll
      for (int i = 0; i < 4; ++i) q[r][i] = __funnelshift_rc(v[i], v[i + 1], 8 * (at + 1));
    }
    if (big) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = big_block(rp[r] + size_t(u) * 17, xp[t] + xs * u, acc[r][t]);
      return;
    }
    uint32_t val[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j) values8(q[r][j], val[r][2 * j], val[r][2 * j + 1]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float* xu = xp[t] + xs * u;
      uint4 tv[4][2];
      terms32(xu, 0, tv);
      const float cs = xu[kScales];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] = fmaf(sc[r], dot32<true>(val[r], tv) * cs, acc[r][t]);
    }
  }
};

// Q4_K and Q5_K, half a block (4 sub-blocks of 32, each with its 6-bit scale and
// min) a unit: Q4_K's nibbles masked in place (the high one times 16, taken out by
// the chunk's scale), Q5_K's nibble and high bit made the byte v = nibble + 16 hb.
template <bool kQ5>
struct TQ45_K8 : Terms128 {
  static constexpr int kBlock = kQ5 ? 176 : 144;  // both multiples of 16
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t q[R][16], qh[R][8], sc[R][3];
    float d[R], dm[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * kBlock;
      k4_head(b, d[r], dm[r], sc[r]);
      const uint8_t* qs = b + (kQ5 ? 48 : 16) + 64 * h;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 w = ld128(qs + 16 * i);
        q[r][4 * i] = w.x; q[r][4 * i + 1] = w.y; q[r][4 * i + 2] = w.z; q[r][4 * i + 3] = w.w;
      }
      if (kQ5) {
        // Sub-block 4h + g's high bits are bit 4h + g of each byte: shifted by 4h
        // once here, so that chunk g's shift is known at compile time.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint4 w = ld128(b + 16 + 16 * i);
          qh[r][4 * i] = w.x >> (4 * h); qh[r][4 * i + 1] = w.y >> (4 * h);
          qh[r][4 * i + 2] = w.z >> (4 * h); qh[r][4 * i + 3] = w.w >> (4 * h);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      float dl[R], ml[R];
      uint32_t v[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // Sub-block 4h + g, each call's index known at compile time (one of 4h + g
        // took 176 more instructions at one token).
        int s, m;
        if (h == 0) k4_scale_min(sc[r], g, s, m);
        else k4_scale_min(sc[r], g + 4, s, m);
        dl[r] = d[r] * float(s);
        ml[r] = dm[r] * float(m);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t w = q[r][8 * (g >> 1) + i];
          if (kQ5) {
            const uint32_t hb = (qh[r][i] << (4 - g)) & 0x10101010u;  // bit g to bit 4
            v[r][i] = ((g & 1 ? w >> 4 : w) & 0x0F0F0F0Fu) | hb;
          } else {
            v[r][i] = w & (g & 1 ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xu = xp[t] + xs * u;
        const float cs = xu[kScales + g] * (!kQ5 && (g & 1) ? 0.0625f : 1.0f);
        const float sx = xu[kSums + 2 * g] + xu[kSums + 2 * g + 1];
        uint4 tv[4][2];
        terms32(xu, g, tv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float s1 = dot32(v[r], tv) * cs;
          acc[r][t] = fmaf(-ml[r], sx, fmaf(dl[r], s1, acc[r][t]));
        }
      }
    }
  }
};

// Q6_K: each weight's low 4 and high 2 bits make the unsigned byte v (0..63), the
// weight is scale * (v - 32) and a sub-block's sum scale * (sum v x - 32 sum x).
struct TQ6_K8 : Terms128 {
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t ql[R][16], qh[R][8], sc[R][2];
    float d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * 210;  // 2-byte aligned
      ldwords<16>(b + 64 * h, ql[r]);
      ldwords<8>(b + 128 + 32 * h, qh[r]);
      ldwords<2>(b + 192 + 8 * h, sc[r]);
      d[r] = h2f(ld16(b + 208));
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      float cs[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) cs[t] = xp[t][xs * u + kScales + g];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int sb = 2 * g + half;
        float dl[R];
        uint32_t v[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          dl[r] = d[r] * float(int8_t((sc[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu));
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t lo = (ql[r][8 * (g & 1) + 4 * half + j] >> (g < 2 ? 0 : 4)) & 0x0F0F0F0Fu;
            const uint32_t hw = qh[r][4 * half + j];
            const uint32_t hi = (g < 3 ? hw << (4 - 2 * g) : hw >> 2) & 0x30303030u;  // bits 2g, 2g+1 to 4, 5
            v[r][j] = lo | hi;
          }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const float* xu = xp[t] + xs * u;
          uint4 tv[4];
          terms16(xu, g, half, tv);
          const float sx32 = 32.0f * xu[kSums + sb];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float s1 = dot16(v[r], tv) * cs[t];
            acc[r][t] = fmaf(-dl[r], sx32, fmaf(dl[r], s1, acc[r][t]));
          }
        }
      }
    }
  }
};

// ---- Q3_K: half a 110-byte block per unit ------------------------------------------

struct TQ3_K {
  static constexpr int kUnit = 128;
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t hm[R][8], q[R][8], sc[R][3];
    float d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * 110;  // 2-byte aligned
      ldwords<8>(b, hm[r]);
      ldwords<8>(b + 32 + 32 * h, q[r]);
      ldwords<3>(b + 96, sc[r]);
      d[r] = h2f(ld16(b + 108));
    }
    const int e0 = xs * u;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const int e = e0 + 32 * g + 16 * half;
        const int hbit = 4 * h + g;
        float s1[R][NT] = {};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float4 xv[NT];
#pragma unroll
          for (int t = 0; t < NT; ++t) xv[t] = ldx(xp[t] + e + 4 * k);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint32_t low = (q[r][4 * half + k] >> (2 * g)) & 0x03030303u;
            const uint32_t hb = (hm[r][4 * half + k] >> hbit) & 0x01010101u;
            float f[4];
            unpack4(low | (hb << 2), 4.0f, f);  // low - (hb ? 0 : 4)
#pragma unroll
            for (int t = 0; t < NT; ++t) s1[r][t] = dot4(f, xv[t], s1[r][t]);
          }
        }
        // Sub-block j = 8h + sb (q3k_scale).
        const int sb = 2 * g + half;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float dl = d[r] * float(q3k_scale(sc[r], sb, h));
#pragma unroll
          for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(dl, s1[r][t], acc[r][t]);
        }
      }
    }
  }
};

// ---- Q4_K / Q5_K: a quarter of the block (two 32-element sub-blocks) per unit ---------

template <bool kQ5>
struct TQ45_K {
  static constexpr int kUnit = 64;
  static constexpr int kBlock = kQ5 ? 176 : 144;  // both multiples of 16
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 2, p = u & 3;
    uint32_t q[R][8], qh[R][8], sc[R][3];
    float d[R], dm[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * kBlock;
      k4_head(b, d[r], dm[r], sc[r]);
      const uint8_t* qs = b + (kQ5 ? 48 : 16) + 32 * p;
      const uint4 q0 = ld128(qs), q1 = ld128(qs + 16);
      q[r][0] = q0.x; q[r][1] = q0.y; q[r][2] = q0.z; q[r][3] = q0.w;
      q[r][4] = q1.x; q[r][5] = q1.y; q[r][6] = q1.z; q[r][7] = q1.w;
      if (kQ5) {
        const uint4 h0 = ld128(b + 16), h1 = ld128(b + 32);
        qh[r][0] = h0.x; qh[r][1] = h0.y; qh[r][2] = h0.z; qh[r][3] = h0.w;
        qh[r][4] = h1.x; qh[r][5] = h1.y; qh[r][6] = h1.z; qh[r][7] = h1.w;
      }
    }
#pragma unroll
    for (int nib = 0; nib < 2; ++nib) {
      const int j = 2 * p + nib;
      const int e = xs * u + 32 * nib;
      float s1[R][NT] = {}, sx[NT] = {};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float4 xv[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          xv[t] = ldx(xp[t] + e + 4 * k);
          sx[t] += sum4(xv[t]);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          uint32_t v = (q[r][k] >> (4 * nib)) & 0x0F0F0F0Fu;
          if (kQ5) v |= ((qh[r][k] >> j) & 0x01010101u) << 4;
          float f[4];
          unpack4(v, 0.0f, f);
#pragma unroll
          for (int t = 0; t < NT; ++t) s1[r][t] = dot4(f, xv[t], s1[r][t]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        int s, m;
        k4_scale_min(sc[r], j, s, m);
        const float dl = d[r] * float(s);
        const float ml = dm[r] * float(m);
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(-ml, sx[t], fmaf(dl, s1[r][t], acc[r][t]));
      }
    }
  }
};

// ---- Q6_K: half a 210-byte block per unit -----------------------------------------

struct TQ6_K {
  static constexpr int kUnit = 128;
  template <int NT, int R>
  __device__ static void run(const uint8_t* const (&rp)[R], int u, const float* const (&xp)[NT],
                             Acc<NT, R>& acc, int xs) {
    const int blk = u >> 1, h = u & 1;
    uint32_t ql[R][16], qh[R][8], sc[R][2];
    float d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = rp[r] + size_t(blk) * 210;  // 2-byte aligned
      ldwords<16>(b + 64 * h, ql[r]);
      ldwords<8>(b + 128 + 32 * h, qh[r]);
      ldwords<2>(b + 192 + 8 * h, sc[r]);
      d[r] = h2f(ld16(b + 208));
    }
    const int e0 = xs * u;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = e0 + 32 * g + 16 * half;
        float s1[R][NT] = {};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float4 xv[NT];
#pragma unroll
          for (int t = 0; t < NT; ++t) xv[t] = ldx(xp[t] + e + 4 * k);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint32_t lo = (ql[r][8 * (g & 1) + 4 * half + k] >> (g < 2 ? 0 : 4)) & 0x0F0F0F0Fu;
            const uint32_t hi = (qh[r][4 * half + k] >> (2 * g)) & 0x03030303u;
            float f[4];
            unpack4(lo | (hi << 4), 32.0f, f);
#pragma unroll
            for (int t = 0; t < NT; ++t) s1[r][t] = dot4(f, xv[t], s1[r][t]);
          }
        }
        const int sb = 2 * g + half;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int8_t s = int8_t((sc[r][sb >> 2] >> (8 * (sb & 3))) & 0xFFu);
          const float dsc = d[r] * float(s);
#pragma unroll
          for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(dsc, s1[r][t], acc[r][t]);
        }
      }
    }
  }
};

}  // namespace xpack::kernels::dev
