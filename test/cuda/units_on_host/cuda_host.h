// The CUDA names that cuda/quant_blocks.cuh and cuda/matvec_units.cuh use,
// defined for the host compiler, so that the decode kernel's units (one lane's
// arithmetic over its unit of a row) run on a machine without a GPU or nvcc
// (test_units_on_host.cpp). Each intrinsic does what the PTX ISA says of it,
// with the same rounding; warp operations run over 32 host threads (run_warp),
// which meet at a barrier where a warp's lanes would exchange values.
#pragma once

#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define XPACK_UNITS_ON_HOST 1
#define __device__
#define __host__
#define __forceinline__ inline
#define __constant__ const

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
struct dim3_host { unsigned int x = 0, y = 0, z = 0; };

// Lane of the calling host thread in run_warp (0 outside it).
inline thread_local dim3_host threadIdx;

// Loads through memcpy: the kernels reinterpret block bytes as words, which the
// device allows and C++ does not. Alignment is checked as the device would
// fault on it.
template <class T>
inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) std::abort();
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float __uint_as_float(unsigned int u) { return std::bit_cast<float>(u); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline unsigned int __float_as_uint(float f) { return std::bit_cast<unsigned int>(f); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
// The host rounds to nearest and, with -ffp-contract=off, never fuses these.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

// __byte_perm: result byte n is byte s[4n+2:4n] of {y, x} (x bytes 0-3).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t v = (uint64_t(y) << 32) | x;
  unsigned int r = 0;
  for (int n = 0; n < 4; ++n) r |= unsigned((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
  return r;
}
// prmt.b32 in its default mode: as __byte_perm, and a selector nibble with its
// msb set gives the selected byte's sign replicated (0x00 or 0xFF).
inline unsigned int xpack_host_prmt(unsigned int a, unsigned int b, unsigned int s) {
  const uint64_t v = (uint64_t(b) << 32) | a;
  unsigned int r = 0;
  for (int n = 0; n < 4; ++n) {
    const unsigned sel = (s >> (4 * n)) & 0xF;
    unsigned byte = unsigned((v >> (8 * (sel & 7))) & 0xFF);
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    r |= byte << (8 * n);
  }
  return r;
}
// dp4a.u32.s32: unsigned bytes of a times signed bytes of b, added to c.
inline int xpack_host_dp4a_us(unsigned int a, unsigned int b, int c) {
  for (int k = 0; k < 4; ++k) c += int((a >> (8 * k)) & 0xFF) * int(int8_t(uint8_t(b >> (8 * k))));
  return c;
}
// dp4a.s32.s32 (__dp4a): signed bytes of both.
inline int xpack_host_dp4a_ss(unsigned int a, unsigned int b, int c) {
  for (int k = 0; k < 4; ++k) c += int(int8_t(uint8_t(a >> (8 * k)))) * int(int8_t(uint8_t(b >> (8 * k))));
  return c;
}
#define __noinline__
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  return unsigned(((uint64_t(hi) << 32) | lo) >> (shift & 31));
}
inline unsigned int __funnelshift_rc(unsigned int lo, unsigned int hi, unsigned int shift) {
  return unsigned(((uint64_t(hi) << 32) | lo) >> (shift < 32 ? shift : 32));
}

// ---- a warp of host threads ---------------------------------------------------------

namespace xpack_host {
struct Warp {
  std::barrier<> meet{32};
  uint32_t word[32] = {};
  uint32_t frag[32][6] = {};  // the lanes' A and B fragments of an mma (mma_s8)
};
inline Warp*& current_warp() {
  static Warp* w = nullptr;
  return w;
}
// Lane l's value of v, exchanged: every lane writes, meets, reads, meets again
// (so that no lane's next write lands before every read).
inline uint32_t exchange(uint32_t v, unsigned from) {
  Warp& w = *current_warp();
  const unsigned lane = threadIdx.x & 31;
  w.word[lane] = v;
  w.meet.arrive_and_wait();
  const uint32_t r = w.word[from & 31];
  w.meet.arrive_and_wait();
  return r;
}
}  // namespace xpack_host

// mma.sync.aligned.m16n8k{16,32}.row.col.s32.s8.s8.s32 as the PTX ISA lays out its
// fragments: lane (g = lane / 4, c = lane % 4) holds A rows g (a[0]) and g + 8 (a[1])
// at k = 4c..4c+3 and, for k32, the same rows at 16 + 4c.. (a[2], a[3]); B column g
// at k = 4c.. (b[0]) and, for k32, 16 + 4c.. (b[1]); C and D rows g, g + 8 at
// columns 2c, 2c + 1. Bytes in increasing k from the low one, signed.
namespace xpack_host {
template <int K>
inline void mma_s8(int (&d)[4], const uint32_t* a, const uint32_t* b, const int (&cin)[4]) {
  Warp& w = *current_warp();
  const unsigned lane = threadIdx.x & 31;
  for (int i = 0; i < K / 8; ++i) w.frag[lane][i] = a[i];
  for (int i = 0; i < K / 16; ++i) w.frag[lane][4 + i] = b[i];
  w.meet.arrive_and_wait();
  auto byte = [](uint32_t v, int k) { return int(int8_t(uint8_t(v >> (8 * (k & 3))))); };
  const int g = int(lane >> 2), c = int(lane & 3);
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * c + (i & 1);
    int s = cin[i];
    for (int k = 0; k < K; ++k) {
      const int kk = k & 15, hi = k >> 4;
      const int av = byte(w.frag[(row & 7) * 4 + kk / 4][(row >> 3) + 2 * hi], k);
      const int bv = byte(w.frag[col * 4 + kk / 4][4 + hi], k);
      s += av * bv;
    }
    d[i] = s;
  }
  w.meet.arrive_and_wait();  // every lane has read the fragments before the next mma writes
}
}  // namespace xpack_host
inline void xpack_host_mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, const int (&c)[4]) {
  const uint32_t b[2] = {b0, b1};
  xpack_host::mma_s8<32>(d, a, b, c);
}
inline void xpack_host_mma_k16(int (&d)[4], const uint32_t (&a)[2], uint32_t b0, const int (&c)[4]) {
  xpack_host::mma_s8<16>(d, a, &b0, c);
}

// Runs fn() on 32 host threads as the lanes of one warp (threadIdx.x = lane).
// One warp at a time.
inline void run_warp(const std::function<void()>& fn) {
  xpack_host::Warp warp;
  xpack_host::current_warp() = &warp;
  std::vector<std::thread> lanes;
  for (unsigned l = 0; l < 32; ++l)
    lanes.emplace_back([&fn, l] {
      threadIdx.x = l;
      fn();
    });
  for (auto& t : lanes) t.join();
  xpack_host::current_warp() = nullptr;
}

inline void __syncwarp(unsigned = 0xFFFFFFFFu) {
  xpack_host::current_warp()->meet.arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int off) {
  return std::bit_cast<float>(xpack_host::exchange(std::bit_cast<uint32_t>(v), (threadIdx.x & 31) ^ unsigned(off)));
}
inline unsigned int __reduce_max_sync(unsigned, unsigned int v) {
  unsigned int m = v;
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned int o = xpack_host::exchange(v, l);
    m = o > m ? o : m;
  }
  return m;
}
