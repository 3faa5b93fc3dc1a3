// Exact dequantization of the ggml tensor types xpack-run meets, written from the
// block layouts in shared/reference/gguf-and-quant-formats.md.
//
// Every decoder evaluates its products in the same order as ggml's reference
// CPU decoders (ggml-quants.c), one rounding per operation: this file is compiled
// with -ffp-contract=off so that `dl * q - ml` is never fused into an FMA, which
// would change the last bit for some inputs and break bit-identity with llama.cpp.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "dequant.h"
#include "weights.h"
#include "xpack/xpack.h"

namespace xrun {
namespace {


float f32_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN payloads).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);
  // Subnormal half: normalize into a binary32 normal number.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return f32_from_bits(sign | (uint32_t(112 - e) << 23) | ((mant & 0x3FFu) << 13));
}

float load_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e-128), built from bits so e = 0 and 1 give
// the f32 subnormals 2^-128 / 2^-127 and e = 255 gives 2^127 (never NaN).
float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  return f32_from_bits(bits);
}

struct TypeLayout {
  uint32_t block_elems = 0;
  uint32_t block_bytes = 0;
};

TypeLayout layout_of(uint32_t type) {
  switch (type) {
    case XPACK_TYPE_F32: return {1, 4};
    case XPACK_TYPE_F16: return {1, 2};
    case XPACK_TYPE_BF16: return {1, 2};
    case XPACK_TYPE_I32: return {1, 4};
    case XPACK_TYPE_Q8_0: return {32, 34};
    case XPACK_TYPE_Q2_K: return {256, 84};
    case XPACK_TYPE_Q3_K: return {256, 110};
    case XPACK_TYPE_Q4_K: return {256, 144};
    case XPACK_TYPE_Q5_K: return {256, 176};
    case XPACK_TYPE_Q6_K: return {256, 210};
    case XPACK_TYPE_MXFP4: return {32, 17};
    default: return {};
  }
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

// Element i = 128h + 32g + l takes bits 2g..2g+1 of qs[32h + l] and the scale
// byte of its 16-element sub-block (8h + 2g + l/16).
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 4; ++g) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t s = scales[8 * h + 2 * g + half];
        const float dl = d * float(s & 0xF);
        const float ml = dmin * float(s >> 4);
        const uint8_t* q = qs + 32 * h + 16 * half;
        float* out = y + 128 * h + 32 * g + 16 * half;
        for (int l = 0; l < 16; ++l) out[l] = dl * float((q[l] >> (2 * g)) & 3) - ml;
      }
    }
  }
}

// Sixteen 6-bit Q3_K scales packed into 12 bytes, unpacked to -32..31.
int q3_k_scale(const uint8_t* scales, int j) {
  const int lo4 = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int hi2 = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo4 | (hi2 << 4)) - 32;
}

void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = load_f16(b + 108);
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 4; ++g) {
      const int hbit = 4 * h + g;
      for (int half = 0; half < 2; ++half) {
        const float dl = d * float(q3_k_scale(scales, 8 * h + 2 * g + half));
        const uint8_t* q = qs + 32 * h + 16 * half;
        const uint8_t* hm = hmask + 16 * half;
        float* out = y + 128 * h + 32 * g + 16 * half;
        for (int l = 0; l < 16; ++l) {
          const int low = (q[l] >> (2 * g)) & 3;
          const int qv = low - (((hm[l] >> hbit) & 1) ? 0 : 4);
          out[l] = dl * float(qv);
        }
      }
    }
  }
}

// get_scale_min_k4: eight 6-bit scales and eight 6-bit mins in 12 bytes (Q4_K, Q5_K).
void k4_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(scales, j, &sc, &m);
    const float d1 = d * float(sc);
    const float m1 = dmin * float(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) y[32 * j + l] = d1 * float((q[l] >> shift) & 0xF) - m1;
  }
}

// Q5_K: d, dmin f16 @0/@2, scales[12] @4 (Q4_K packing), qh[32] @16, qs[128] @48.
// Element 32j+l takes low nibble from qs[32(j/2)+l] (low half for even j) and its
// fifth bit from bit j of qh[l].
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(scales, j, &sc, &m);
    const float d1 = d * float(sc);
    const float m1 = dmin * float(m);
    const uint8_t* ql = qs + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int q = ((ql[l] >> shift) & 0xF) + (((qh[l] >> j) & 1) ? 16 : 0);
      y[32 * j + l] = d1 * float(q) - m1;
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 4; ++g) {
      const uint8_t* lo = ql + 64 * h + 32 * (g & 1);
      const int lo_shift = g < 2 ? 0 : 4;
      const uint8_t* hi = qh + 32 * h;
      for (int half = 0; half < 2; ++half) {
        // ggml evaluates d * sc * q left to right: (d * sc) is rounded first.
        const float dsc = d * float(scales[8 * h + 2 * g + half]);
        float* out = y + 128 * h + 32 * g + 16 * half;
        for (int k = 0; k < 16; ++k) {
          const int l = 16 * half + k;
          const int q = (((lo[l] >> lo_shift) & 0xF) | (((hi[l] >> (2 * g)) & 3) << 4)) - 32;
          out[k] = dsc * float(q);
        }
      }
    }
  }
}

constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void dequant_mxfp4(const uint8_t* b, float* y) {
  const float s = e8m0_to_f32_half(b[0]);
  // The same product per code as decoding element by element, computed once.
  float value[16];
  for (int k = 0; k < 16; ++k) value[k] = float(kMxfp4Values[k]) * s;
  const uint8_t* qs = b + 1;
  for (int j = 0; j < 16; ++j) {
    y[j] = value[qs[j] & 0xF];
    y[j + 16] = value[qs[j] >> 4];
  }
}

[[noreturn]] void fail(const std::string& what) { throw ModelError(what); }

}  // namespace

size_t row_bytes(uint32_t type, int64_t ne0) {
  const TypeLayout t = layout_of(type);
  if (t.block_elems == 0) fail("row_bytes: unsupported ggml type " + std::to_string(type));
  if (ne0 < 0 || ne0 % t.block_elems != 0)
    fail("row_bytes: row of " + std::to_string(ne0) + " elements is not a whole number of " +
         std::to_string(t.block_elems) + "-element blocks (type " + std::to_string(type) + ")");
  return size_t(ne0 / t.block_elems) * t.block_bytes;
}

void dequantize(uint32_t type, const void* src, float* dst, int64_t n) {
  const TypeLayout t = layout_of(type);
  if (t.block_elems == 0) fail("dequantize: unsupported ggml type " + std::to_string(type));
  if (n < 0 || n % t.block_elems != 0)
    fail("dequantize: " + std::to_string(n) + " elements is not a whole number of blocks");
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const int64_t n_blocks = n / t.block_elems;
  switch (type) {
    case XPACK_TYPE_F32:
      std::memcpy(dst, p, size_t(n) * sizeof(float));
      return;
    case XPACK_TYPE_F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f16(p + 2 * i);
      return;
    case XPACK_TYPE_BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f32_from_bits(uint32_t(load_u16(p + 2 * i)) << 16);
      return;
    case XPACK_TYPE_I32:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, sizeof v);
        dst[i] = float(v);
      }
      return;
    default:
      break;
  }
  void (*decode)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case XPACK_TYPE_Q8_0: decode = dequant_q8_0; break;
    case XPACK_TYPE_Q2_K: decode = dequant_q2_k; break;
    case XPACK_TYPE_Q3_K: decode = dequant_q3_k; break;
    case XPACK_TYPE_Q4_K: decode = dequant_q4_k; break;
    case XPACK_TYPE_Q5_K: decode = dequant_q5_k; break;
    case XPACK_TYPE_Q6_K: decode = dequant_q6_k; break;
    case XPACK_TYPE_MXFP4: decode = dequant_mxfp4; break;
    default: fail("dequantize: unsupported ggml type " + std::to_string(type));
  }
  for (int64_t b = 0; b < n_blocks; ++b)
    decode(p + size_t(b) * t.block_bytes, dst + b * t.block_elems);
}

}  // namespace xrun
