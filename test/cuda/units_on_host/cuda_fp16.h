// Host stand-in for CUDA's cuda_fp16.h (see cuda_host.h): the half type and the
// conversions the decode units use, exact.
#pragma once

#include "cuda_host.h"

struct __half { unsigned short x; };
struct __half2 { __half x, y; };

inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __half2float(__half h) {
  const uint32_t s = uint32_t(h.x >> 15) << 31, e = (h.x >> 10) & 0x1F, m = h.x & 0x3FF;
  if (e == 0x1F) return std::bit_cast<float>(s | 0x7F800000u | (m << 13));
  if (e != 0) return std::bit_cast<float>(s | ((e + 112) << 23) | (m << 13));
  const float v = std::ldexp(float(m), -24);  // subnormal: exact
  return s ? -v : v;
}
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
