// The CUDA compute kernels (cuda/quant_matmul.h) against the CPU: every weight
// type on random blocks (random quant bytes, sane random fp16 scales), the CPU
// reference being xpack-run's exact decoder (dequant.cpp) followed by a dot
// product in double; float_gemm (products of two fp32 activations) against a
// host loop. Without a CUDA device the program exits 77 (SKIP).
//
// Tolerance (fp32 paths): |y - ref| <= 1e-5 * sum_i |w_i * x_i| per output, the
// sum of magnitudes being the scale of the rounding errors of an fp32 dot product.
// The bf16 option: 4e-3 * sum|w*x| (each operand rounded to 8 significant bits).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops.h"
#include "random_blocks.h"
#include "quant_matmul.h"
#include "quant_mma.h"

namespace xk = xpack::kernels;
using namespace random_blocks;

namespace {

constexpr double kTolBf16 = 4e-3;

const uint32_t kTypes[] = {xk::kF32, xk::kF16, xk::kBF16, xk::kQ8_0, xk::kQ4_K,
                           xk::kQ5_K, xk::kQ6_K, xk::kQ2_K, xk::kQ3_K, xk::kMXFP4};


// Elements of one matvec "unit" (the kernel's per-thread step), to pick row
// lengths that exercise each thread-per-row choice (32, 64, 128).
int unit_elems(uint32_t t) {
  switch (t) {
    case xk::kF32: case xk::kF16: case xk::kBF16: return 8;
    case xk::kQ8_0: case xk::kMXFP4: return 32;
    case xk::kQ4_K: case xk::kQ5_K: return 64;
    default: return 128;
  }
}

void check_cuda(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { check_cuda(cudaMalloc(&p, bytes ? bytes : 1)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  void put(const void* src, size_t bytes) { check_cuda(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice)); }
  void get(void* dst, size_t bytes) const { check_cuda(cudaMemcpy(dst, p, bytes, cudaMemcpyDeviceToHost)); }
  // NaN floats: unwritten outputs fail. cudaMemset runs on the legacy default
  // stream, which does not order against the tests' non-blocking stream: without
  // the synchronisation the fill could land after the kernel under test wrote
  // (it did once, with other GPU tests running beside this one).
  void poison() {
    check_cuda(cudaMemset(p, 0xFF, n));
    check_cuda(cudaDeviceSynchronize());
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { check_cuda(cudaStreamSynchronize(s)); check_cuda(cudaGetLastError()); }
};

// A random matrix and n_tokens random rows of x, on the device, with the CPU reference.
struct MatvecCase {
  std::vector<uint8_t> w;
  std::vector<float> x;
  DevBuf dw, dx, dy;
  Ref ref;
  MatvecCase(uint32_t type, int64_t ne0, int64_t ne1, int n_tokens, std::mt19937& rng)
      : w(random_weights(type, ne0, ne1, rng)),
        x(random_x(size_t(n_tokens * ne0), rng)),
        dw(w.size()),
        dx(x.size() * 4),
        dy(size_t(n_tokens * ne1) * 4),
        ref(reference(type, w, ne0, ne1, x.data(), n_tokens)) {
    dw.put(w.data(), w.size());
    dx.put(x.data(), x.size() * 4);
  }
};

// y = W x through matvec() at n tokens, the output poisoned first (an unwritten
// output fails the comparisons).
std::vector<float> matvec_y(const Stream& st, uint32_t type, const DevBuf& dw, int64_t ne0, int64_t ne1,
                            const DevBuf& dx, int n, DevBuf& dy) {
  dy.poison();
  REQUIRE(xk::matvec(type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), st.s) == xk::kOk);
  st.sync();
  std::vector<float> got(size_t(n * ne1));
  dy.get(got.data(), got.size() * 4);
  return got;
}

// The tensor-core kernel's layouts (warps a tile, tiles a block of threads).
constexpr int kMmaLayouts[][2] = {{4, 2}, {4, 4}, {8, 2}, {16, 1}};
void set_mma_layout(size_t l) {
  xk::dev::set_matvec_geometry(0, true, 0, true, xk::dev::kMmaDecodeAlways, kMmaLayouts[l][0], kMmaLayouts[l][1]);
}

}  // namespace

TEST_CASE("dequantize_rows equals the CPU decoders bit for bit") {
  std::mt19937 rng(1);
  Stream st;
  for (uint32_t type : kTypes) {
    CAPTURE(xk::type_name(type));
    const int64_t ne0 = xk::block_elems(type) == 1 ? 72 : 2 * 256, rows = 37;
    const auto w = random_weights(type, ne0, rows, rng);
    DevBuf dw(w.size()), dout(size_t(ne0 * rows) * 4);
    dw.put(w.data(), w.size());
    dout.poison();
    REQUIRE(xk::dequantize_rows(type, dw.p, ne0, rows, dout.as<float>(), st.s) == xk::kOk);
    st.sync();
    std::vector<float> got(size_t(ne0 * rows)), want(got.size());
    dout.get(got.data(), got.size() * 4);
    xrun::dequantize(type, w.data(), want.data(), ne0 * rows);
    CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
  }
}

TEST_CASE("matvec: every type, 1..8 tokens, four row lengths, odd row counts") {
  std::mt19937 rng(2);
  Stream st;
  for (uint32_t type : kTypes) {
    // 4, 80, 136 units: 32, 64 and 128 threads per row; 6656 elements: x of 5..8
    // tokens too large for shared memory (the kernel reads it from global memory).
    for (int units : {4, 80, 136, 0}) {
      const int64_t ne0 = units ? int64_t(units) * unit_elems(type) : 6656, ne1 = 37;
      CAPTURE(xk::type_name(type));
      CAPTURE(ne0);
      MatvecCase c(type, ne0, ne1, 8, rng);
      std::vector<float> ones[std::size(kMmaLayouts)], first;
      for (int n = 1; n <= 8; ++n) {
        CAPTURE(n);
        const auto got = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
        CHECK(count_bad(got, head(c.ref, size_t(n * ne1)), kTolFp32, xk::type_name(type)) == 0);
        if (xk::block_elems(type) == 256 || type == xk::kMXFP4) {
          // K-quant rows, and MXFP4 rows with the tensor cores off (by default they
          // take rows of whole 512-input groups from two tokens on: 6656 inputs), take
          // the dp4a units (up to about 46000 inputs on an H200, in passes of fewer
          // tokens where 8 tokens' x does not fit: 6656 and 17408 inputs here): the
          // first token's bits do not change with the token count; the FMA unit,
          // switched back on, keeps the bound and gives other bits.
          const int mma_mode = type == xk::kMXFP4 ? xk::dev::kMmaDecodeNever : xk::dev::kMmaDecodeAuto;
          xk::dev::set_matvec_geometry(0, true, 0, true, mma_mode);
          const auto dp4a = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
          CHECK(count_bad(dp4a, head(c.ref, size_t(n * ne1)), kTolFp32, "the dp4a unit") == 0);
          if (n == 1) first = dp4a;
          CHECK(std::memcmp(dp4a.data(), first.data(), size_t(ne1) * 4) == 0);
          xk::dev::set_matvec_geometry(0, true, 0, true, mma_mode, 0, 0, false);
          const auto fma = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
          xk::dev::set_matvec_geometry(0, true);
          CHECK(count_bad(fma, head(c.ref, size_t(n * ne1)), kTolFp32, "the FMA unit") == 0);
          CHECK(std::memcmp(fma.data(), dp4a.data(), dp4a.size() * 4) != 0);
        }
        if (type != xk::kMXFP4) continue;
        // MXFP4 on the tensor cores stages x in segments that depend on the token
        // count (6656 inputs: 1 segment up to 2 tokens, 2 at 4, 4 at 8); the first
        // token's bits must not, in any of its layouts.
        for (size_t l = 0; l < std::size(kMmaLayouts); ++l) {
          CAPTURE(kMmaLayouts[l][0]);
          CAPTURE(kMmaLayouts[l][1]);
          set_mma_layout(l);
          const auto mma = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
          xk::dev::set_matvec_geometry(0, true);
          CHECK(count_bad(mma, head(c.ref, size_t(n * ne1)), kTolFp32, "mxfp4 on the tensor cores") == 0);
          if (n == 1) ones[l] = mma;
          CHECK(std::memcmp(mma.data(), ones[l].data(), size_t(ne1) * 4) == 0);
        }
      }
    }
  }
}

// Every quantized type at ne0 x ne1 and one and three tokens, the default layout's
// y checked against the bound, then fn(stream, type, case, n, y) for the variants.
template <class F>
void each_quantized_matvec(int64_t ne0, int64_t ne1, uint32_t seed, F&& fn) {
  std::mt19937 rng(seed);
  Stream st;
  for (uint32_t type : kTypes) {
    if (xk::block_elems(type) == 1) continue;
    CAPTURE(xk::type_name(type));
    MatvecCase c(type, ne0, ne1, 3, rng);
    for (int n : {1, 3}) {
      CAPTURE(n);
      const auto got = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
      CHECK(count_bad(got, head(c.ref, got.size()), kTolFp32, xk::type_name(type)) == 0);
      fn(st, type, c, n, got);
      xk::dev::set_matvec_geometry(0, true);  // the defaults again
    }
  }
}

// Tall matrices: the decode kernel's blocks loop over many row groups each (the grid
// is one wave), in 256- or 512-thread blocks as the occupancy decides; rows of 1792
// inputs end 8, 12, 2 and 14 bytes past a 16-byte boundary for MXFP4, Q2_K, Q3_K and
// Q6_K; 20001 rows leave the last row group partial. Every forced layout (256 or 512
// threads, one wave per launch or per problem, MXFP4's FMA units loaded one ahead or
// not) gives the bits of its kernel's default layout: the default kernel (the dp4a
// units for the K-quants and MXFP4), the FMA units (dp4a switched off), and MXFP4
// with the tensor-core switch on, which must give the default's bits: rows of 1792
// inputs are not whole groups of 16 blocks, so the switch leaves them where they were
// (the tensor-core kernel's rows are checked by the test above at 2560 and 6656
// inputs, by the next one at 2048 and by the E8M0 test).
TEST_CASE("matvec: tall matrices of every quantized type, rows at any 16-byte offset") {
  const int64_t ne0 = 1792, ne1 = 20001;
  each_quantized_matvec(ne0, ne1, 12, [&](Stream& st, uint32_t type, MatvecCase& c, int n, const std::vector<float>& got) {
    const bool has_dp4a = xk::block_elems(type) == 256 || type == xk::kMXFP4;
    for (const int variant : {0, 1, 2}) {  // the default, the FMA units, MXFP4's tensor-core switch on
      if ((variant == 1 && !has_dp4a) || (variant == 2 && type != xk::kMXFP4)) continue;
      CAPTURE(variant);
      const int mma = variant == 2 ? xk::dev::kMmaDecodeAlways : xk::dev::kMmaDecodeAuto;
      const bool dp4a = variant != 1;
      std::vector<float> want = got;
      if (variant == 1) {
        xk::dev::set_matvec_geometry(0, true, 0, true, mma, 0, 0, dp4a);
        want = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
        CHECK(count_bad(want, head(c.ref, want.size()), kTolFp32, "the FMA units") == 0);
      }
      for (const int threads : {256, 512})
        for (const bool shared_wave : {false, true})
          for (const bool pipeline : {false, true}) {
            CAPTURE(threads);
            CAPTURE(shared_wave);
            CAPTURE(pipeline);
            xk::dev::set_matvec_geometry(threads, shared_wave, 0, pipeline, mma, 0, 0, dp4a);
            const auto again = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
            CHECK(std::memcmp(again.data(), want.data(), want.size() * 4) == 0);
          }
    }
  });
}

// MXFP4 rows of whole groups of 16 blocks, so the tensor-core switch takes them:
// 2048 inputs are 4 groups (half of 8 warps of a tile have none), 20001 rows make
// 1251 tiles, many per block of threads, the last one partial. Each layout is
// within the bound, and its first token's bits are the same at one and at three tokens.
TEST_CASE("matvec: tall MXFP4 matrices on the tensor cores, every layout") {
  std::mt19937 rng(13);
  Stream st;
  const int64_t ne0 = 2048, ne1 = 20001;
  MatvecCase c(xk::kMXFP4, ne0, ne1, 3, rng);
  for (size_t l = 0; l < std::size(kMmaLayouts); ++l) {
    CAPTURE(kMmaLayouts[l][0]);
    CAPTURE(kMmaLayouts[l][1]);
    std::vector<float> one;
    for (int n : {1, 3}) {
      CAPTURE(n);
      set_mma_layout(l);
      const auto got = matvec_y(st, xk::kMXFP4, c.dw, ne0, ne1, c.dx, n, c.dy);
      xk::dev::set_matvec_geometry(0, true);
      CHECK(count_bad(got, head(c.ref, got.size()), kTolFp32, "mxfp4 on the tensor cores") == 0);
      if (n == 1) one = got;
      CHECK(std::memcmp(got.data(), one.data(), one.size() * 4) == 0);
    }
  }
}

// 8192 inputs: 256 units of the 32-element types, 64 of the K-quants' half blocks,
// so every cap on the threads of a group of rows changes how a row's units are
// dealt out for some type.
TEST_CASE("matvec: fewer threads per group of rows (each lane walks more units) stays within the bound") {
  const int64_t ne0 = 8192, ne1 = 203;
  each_quantized_matvec(ne0, ne1, 29, [&](Stream& st, uint32_t type, MatvecCase& c, int n, const std::vector<float>&) {
    for (const int row_threads : {32, 64, 128, 256}) {
      CAPTURE(row_threads);
      xk::dev::set_matvec_geometry(0, true, row_threads);
      const auto got = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
      CHECK(count_bad(got, head(c.ref, got.size()), kTolFp32, xk::type_name(type)) == 0);
    }
  });
  xk::dev::set_matvec_geometry(0, true);
}

// The float types' units are 8 inputs: 2048 inputs make 256, which 256 threads a row take.
TEST_CASE("matvec: float types with a whole block a row, and F32's unit variants, stay within the bound") {
  std::mt19937 rng(31);
  Stream st;
  const int64_t ne0 = 2048, ne1 = 37;
  for (uint32_t type : {xk::kF32, xk::kF16, xk::kBF16}) {
    CAPTURE(xk::type_name(type));
    MatvecCase c(type, ne0, ne1, 8, rng);
    for (const int n : {1, 3, 8}) {
      CAPTURE(n);
      for (const int row_threads : {0, 256}) {
        CAPTURE(row_threads);
        xk::dev::set_matvec_geometry(0, true, row_threads);
        std::vector<float> by_variant[3];
        for (const int variant : {0, 1, 2, -1}) {  // F32's units (set_f32_variant); the others ignore it
          CAPTURE(variant);
          xk::dev::set_f32_variant(variant);
          const auto got = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
          CHECK(count_bad(got, head(c.ref, got.size()), kTolFp32, xk::type_name(type)) == 0);
          if (variant >= 0) by_variant[variant] = got;
          // Variant 1 only changes the load instruction: the same arithmetic, so the same bits.
          if (variant == 1) CHECK(std::memcmp(got.data(), by_variant[0].data(), got.size() * 4) == 0);
          // The default: units of 4 at one token, of 8 with plain loads from two on.
          if (variant == -1 && type == xk::kF32)
            CHECK(std::memcmp(got.data(), by_variant[n == 1 ? 2 : 0].data(), got.size() * 4) == 0);
        }
      }
    }
  }
  xk::dev::set_f32_variant(-1);
  xk::dev::set_matvec_geometry(0, true);
}

// A switch that must not change a bit (set(true) on, set(false) the default): the
// product with it on is within the bound and equals the product with it off.
void same_bits_switched(void (*set)(bool), Stream& st, uint32_t type, MatvecCase& c, int64_t ne0, int64_t ne1,
                        int n) {
  const auto base = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
  set(true);
  const auto got = matvec_y(st, type, c.dw, ne0, ne1, c.dx, n, c.dy);
  set(false);
  CHECK(count_bad(got, head(c.ref, got.size()), kTolFp32, xk::type_name(type)) == 0);
  CHECK(std::memcmp(got.data(), base.data(), base.size() * 4) == 0);
}

// A group of rows of several warps waits between the rounds of its shared-memory
// sum on a barrier of its own or on the whole block's (set_group_barrier): the same
// sums in the same order, so the same bits, for groups of 64, 128 and 256 threads in
// blocks of 256 and 512.
TEST_CASE("matvec: a group of rows' own barrier gives the block barrier's bits") {
  // 8192 inputs: 256 units of the 32-element types, 64 of the K-quants' half blocks.
  each_quantized_matvec(8192, 203, 41, [&](Stream& st, uint32_t type, MatvecCase& c, int n, const std::vector<float>&) {
    for (const int block : {256, 512})
      for (const int row_threads : {64, 128}) {
        CAPTURE(block);
        CAPTURE(row_threads);
        xk::dev::set_matvec_geometry(block, true, row_threads);
        same_bits_switched(xk::dev::set_group_barrier, st, type, c, 8192, 203, n);
      }
  });
  std::mt19937 rng(43);
  Stream st;
  for (uint32_t type : {xk::kF32, xk::kF16, xk::kBF16}) {  // 2048 inputs: 256 units, 128 threads a group
    CAPTURE(xk::type_name(type));
    MatvecCase c(type, 2048, 45, 8, rng);
    for (const int row_threads : {0, 256})
      for (const int n : {1, 8}) {
        CAPTURE(row_threads);
        CAPTURE(n);
        xk::dev::set_matvec_geometry(0, true, row_threads);
        same_bits_switched(xk::dev::set_group_barrier, st, type, c, 2048, 45, n);
      }
  }
  xk::dev::set_matvec_geometry(0, true);
}

// Q3_K's dp4a unit with its high bits and quants loaded as 16-byte windows
// (set_q3k_wide_loads): the same words, so the same bits, at rows of 16384 inputs
// (16-byte aligned rows) and of 3584 (14 blocks, 1540 bytes: every row at another
// offset in its 16-byte segment), at 1, 3 and 8 tokens: always, never and by the
// default rule (which takes them for this lone product at one token).
TEST_CASE("matvec: Q3_K's wide loads give its usual bits") {
  std::mt19937 rng(53);
  Stream st;
  for (const int64_t ne0 : {16384, 3584}) {
    CAPTURE(ne0);
    const int64_t ne1 = 203;
    MatvecCase c(xk::kQ3_K, ne0, ne1, 8, rng);
    for (const int n : {1, 3, 8}) {
      CAPTURE(n);
      xk::dev::set_q3k_wide_loads(xk::dev::kSwitchOff);
      same_bits_switched(
          [](bool on) { xk::dev::set_q3k_wide_loads(on ? xk::dev::kSwitchOn : xk::dev::kSwitchOff); }, st,
          xk::kQ3_K, c, ne0, ne1, n);
      same_bits_switched(
          [](bool on) { xk::dev::set_q3k_wide_loads(on ? xk::dev::kSwitchAuto : xk::dev::kSwitchOff); }, st,
          xk::kQ3_K, c, ne0, ne1, n);
    }
  }
  xk::dev::set_q3k_wide_loads(xk::dev::kSwitchAuto);
}

// Q2_K and Q3_K on the int8 tensor cores (kquant_mmv.cu), within the fp32 bound
// at 1..8 tokens, and a token's bits the same at every token count.
TEST_CASE("K-quants on the tensor cores: within the bound, bits independent of the token count") {
  std::mt19937 rng(61);
  Stream st;
  // Split over 16 warps at most (the default) and over 3 (a remainder of blocks).
  for (const int split : {0, 3}) {
    xk::dev::set_kq_mmv_split(split);
    for (const uint32_t type : {xk::kQ2_K, xk::kQ3_K}) {
      for (const int64_t ne0 : {256, 3584, 14336}) {
        CAPTURE(split);
        CAPTURE(xk::type_name(type));
        CAPTURE(ne0);
        const int64_t ne1 = 37;
        MatvecCase c(type, ne0, ne1, 8, rng);
        DevBuf scratch(xk::dev::kq_mmv_scratch_bytes(ne0, 8));
        std::vector<float> first;
        for (int n = 1; n <= 8; ++n) {
          CAPTURE(n);
          c.dy.poison();
          REQUIRE(xk::dev::kq_mmv(type, c.dw.p, ne0, ne1, c.dx.as<float>(), n, c.dy.as<float>(), scratch.p,
                                  scratch.n, st.s) == xk::kOk);
          st.sync();
          std::vector<float> got(size_t(n * ne1));
          c.dy.get(got.data(), got.size() * 4);
          CHECK(count_bad(got, head(c.ref, size_t(n * ne1)), kTolFp32, xk::type_name(type)) == 0);
          if (n == 1) first = got;
          CHECK(std::memcmp(got.data(), first.data(), size_t(ne1) * 4) == 0);
        }
      }
    }
  }
  xk::dev::set_kq_mmv_split(0);
  // Refused: another type, rows that are not whole blocks, too small a scratch.
  DevBuf b(1 << 20);
  CHECK(xk::dev::kq_mmv(xk::kQ4_K, b.p, 256, 4, b.as<float>(), 1, b.as<float>(), b.p, b.n, nullptr) == xk::kErrType);
  CHECK(xk::dev::kq_mmv(xk::kQ2_K, b.p, 320, 4, b.as<float>(), 1, b.as<float>(), b.p, b.n, nullptr) ==
        xk::kErrArgument);
  CHECK(xk::dev::kq_mmv(xk::kQ2_K, b.p, 256, 4, b.as<float>(), 1, b.as<float>(), b.p, 16, nullptr) ==
        xk::kErrArgument);
}

TEST_CASE("matvec: float types with rows that are not whole 16-byte vectors") {
  std::mt19937 rng(3);
  Stream st;
  for (uint32_t type : {xk::kF32, xk::kF16, xk::kBF16}) {
    CAPTURE(xk::type_name(type));
    const int64_t ne0 = 67, ne1 = 29;
    const auto w = random_weights(type, ne0, ne1, rng);
    const auto x = random_x(size_t(5 * ne0), rng);
    DevBuf dw(w.size()), dx(x.size() * 4), dy(size_t(5 * ne1) * 4);
    dw.put(w.data(), w.size());
    dx.put(x.data(), x.size() * 4);
    dy.poison();
    REQUIRE(xk::matvec(type, dw.p, ne0, ne1, dx.as<float>(), 5, dy.as<float>(), st.s) == xk::kOk);
    st.sync();
    std::vector<float> got(size_t(5 * ne1));
    dy.get(got.data(), got.size() * 4);
    CHECK(count_bad(got, reference(type, w, ne0, ne1, x.data(), 5), kTolFp32, xk::type_name(type)) == 0);
  }
}

// Row e uses E8M0 exponent e in all 16 of its blocks, whose 32 codes each hold all
// 16 nibbles. Token 0 has x in [-1, 1], token 1 the same times 2^-16. Rows whose
// weights fit in fp32 are compared within the tolerance on whichever token keeps
// the sums in range (e <= 240 for token 0, e >= 100 for token 1). Where ggml's
// weights overflow to inf (e = 253, 254 with large codes) the reference is
// inf/NaN and the kernel must give the same non-finite class. Checked for the
// decode kernels (int8 tensor cores, whose rows of e >= 253 take ggml's own
// weights, the dp4a unit, whose rows of e >= 253 take them against x rebuilt from
// its terms, and the FMA kernel) and for matmul's tensor-core path (two tokens with
// matvec_max_tokens = 1), whose bf16 weights include the subnormal ones of e < 2.
TEST_CASE("matvec and matmul: MXFP4 at every E8M0 exponent 0..254 with every nibble") {
  std::mt19937 rng(4);
  Stream st;
  // 16 blocks a row: the tensor-core path takes rows of whole groups of 16.
  const EveryE8m0 c(512, rng);
  const int64_t ne0 = c.ne0, ne1 = EveryE8m0::kRows;
  DevBuf dw(c.w.size()), dx(c.x.size() * 4), dy(size_t(2 * ne1) * 4);
  dw.put(c.w.data(), c.w.size());
  dx.put(c.x.data(), c.x.size() * 4);
  xk::Context* ctx = nullptr;
  REQUIRE(xk::context_create(&ctx, 0) == xk::kOk);
  // decode on the tensor cores (3 layouts), decode on dp4a, decode by FMA, matmul
  for (const int path : {0, 1, 2, 3, 4, 5}) {
    const bool via_matmul = path == 5;
    CAPTURE(path);
    dy.poison();
    if (path < 3) set_mma_layout(size_t(path));
    else xk::dev::set_matvec_geometry(0, true, 0, true, xk::dev::kMmaDecodeNever, 0, 0, path != 4);
    if (via_matmul) {
      xk::MatmulOptions o{};
      o.size = sizeof o;
      o.matvec_max_tokens = 1;
      REQUIRE(xk::matmul(ctx, xk::kMXFP4, dw.p, ne0, ne1, dx.as<float>(), 2, dy.as<float>(), &o, st.s) == xk::kOk);
    } else {
      REQUIRE(xk::matvec(xk::kMXFP4, dw.p, ne0, ne1, dx.as<float>(), 2, dy.as<float>(), st.s) == xk::kOk);
    }
    st.sync();
    std::vector<float> got(size_t(2 * ne1));
    dy.get(got.data(), got.size() * 4);
    const auto r = c.check(got, kTolFp32, "mxfp4");
    CHECK(r.bad == 0);
    CHECK(r.nonfinite > 0);       // e = 253/254 did overflow on the CPU
    CHECK(r.checked >= 255 + 2);  // every exponent checked at least once
  }
  xk::dev::set_matvec_geometry(0, true);
  xk::context_destroy(ctx);
}

// The tensor-core path of the fp32 default (MXFP4, Q8_0, Q3_K, Q2_K): row
// lengths that end in half a 64-input step (32-element blocks) or span several
// 256-input windows, row counts that end in a partial 64- and 128-row tile (so
// the last row's window ends inside the matrix's last 16 bytes), token counts
// around its 16-, 32- and 64-token tiles; grouped launches of mixed sizes equal
// the separate products bit for bit, and so do the same problems in other tile
// shapes; an x that is not 16-byte aligned takes the tile path and is right too.
TEST_CASE("matmul on tensor cores: fp32 bound at odd shapes, grouped = separate bit for bit") {
  std::mt19937 rng(8);
  Stream st;
  xk::Context* ctx = nullptr;
  REQUIRE(xk::context_create(&ctx, 0) == xk::kOk);
  for (uint32_t type : {xk::kMXFP4, xk::kQ8_0, xk::kQ3_K, xk::kQ2_K}) {
    CAPTURE(xk::type_name(type));
    for (const int64_t ne0 : {int64_t(xk::block_elems(type) == 32 ? 96 : 768), int64_t(4096)}) {
      CAPTURE(ne0);
      const int64_t ne1 = 130;
      // Token counts at the edges of the three tile shapes (16 tokens: 128 x 16;
      // 32 and 64: 64 x 32 and 128 x 64, forced below).
      const int counts[] = {40, 9, 3, 77, 16, 33, 17, 4, 64, 130, 63};
      const int np = 11;
      std::vector<std::vector<uint8_t>> hw;
      std::vector<std::unique_ptr<DevBuf>> ws;
      std::vector<xk::ExpertProblem> probs;
      int rows = 0;
      for (int i = 0; i < np; ++i) {
        hw.push_back(random_weights(type, ne0, ne1, rng));
        ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
        ws.back()->put(hw.back().data(), hw.back().size());
        probs.push_back({ws.back()->p, rows, counts[i]});
        rows += counts[i];
      }
      const auto x = random_x(size_t(rows + 1) * size_t(ne0), rng);
      DevBuf dx(x.size() * 4), dy(size_t(rows * ne1) * 4), dsep(size_t(rows * ne1) * 4);
      dx.put(x.data(), x.size() * 4);
      dy.poison();
      REQUIRE(xk::grouped_matmul(ctx, type, ne0, ne1, probs.data(), np, dx.as<float>(), dy.as<float>(), rows,
                                 nullptr, st.s) == xk::kOk);
      dsep.poison();
      for (const auto& p : probs)
        REQUIRE(xk::matmul(ctx, type, p.w, ne0, ne1, dx.as<float>() + p.row * ne0, p.n_tokens,
                           dsep.as<float>() + p.row * ne1, nullptr, st.s) == xk::kOk);
      st.sync();
      std::vector<float> a(size_t(rows * ne1)), b(a.size());
      dy.get(a.data(), a.size() * 4);
      dsep.get(b.data(), b.size() * 4);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      // Every problem in 64 x 32 tiles however many tokens it has, or in 128 x 64
      // from 17: the same bits as in the tile the rule gave it.
      for (const int from : {1 << 30, 17}) {
        CAPTURE(from);
        xk::dev::set_mma_large_from(from);
        dsep.poison();
        REQUIRE(xk::grouped_matmul(ctx, type, ne0, ne1, probs.data(), np, dx.as<float>(), dsep.as<float>(), rows,
                                   nullptr, st.s) == xk::kOk);
        st.sync();
        xk::dev::set_mma_large_from(0);
        dsep.get(b.data(), b.size() * 4);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      }
      CHECK(xk::dev::mma_large_from() == 0);
      // A workspace of 5 rows' split activations: the problems go in batches and
      // the long ones in parts of tokens, with the same bits (but for the
      // 3-token problem, which takes the decode kernel: a workspace that small
      // does not split its rows).
      {
        const size_t five = xk::dev::mma_split_bytes(type, ne0, 5);
        CHECK(xk::dev::mma_split_rows(type, ne0, five) == 5);
        CHECK(xk::dev::mma_split_rows(type, ne0, five - 1) == 4);
        CHECK(xk::dev::mma_split_rows(type, ne0, xk::dev::mma_split_bytes(type, ne0, 1) - 1) == 0);
        CHECK(xk::dev::mma_split_rows(xk::kQ4_K, 768, size_t(1) << 20) == 0);
        // Rows of more than 2^23 inputs are not the tiles' (their fetch counts a
        // tile's bytes in 32 bits), whatever the workspace.
        const int64_t longest = int64_t(1) << 23;
        CHECK(xk::dev::mma_split_rows(type, longest, xk::dev::mma_split_bytes(type, longest, 1)) == 1);
        CHECK(xk::dev::mma_split_rows(type, longest + 256, size_t(1) << 40) == 0);
        CHECK(xk::dev::mma_split_bytes(xk::kQ4_K, 768, 5) == 0);
        xk::Context* few = nullptr;
        REQUIRE(xk::context_create(&few, five) == xk::kOk);
        dsep.poison();
        REQUIRE(xk::grouped_matmul(few, type, ne0, ne1, probs.data(), np, dx.as<float>(), dsep.as<float>(), rows,
                                   nullptr, st.s) == xk::kOk);
        st.sync();
        dsep.get(b.data(), b.size() * 4);
        for (int i = 0; i < np; ++i) {
          const auto& p = probs[size_t(i)];
          if (p.n_tokens <= 3) continue;
          CAPTURE(i);
          CHECK(std::memcmp(a.data() + p.row * ne1, b.data() + p.row * ne1, size_t(p.n_tokens * ne1) * 4) == 0);
        }
        // Grown to the default's size, the same context gives the default's bits
        // for every problem, the 3-token one's too; asking for less keeps it.
        CHECK(xk::context_reserve(nullptr, five) == xk::kErrArgument);
        REQUIRE(xk::context_reserve(few, size_t(64) << 20) == xk::kOk);
        CHECK(xk::context_reserve(few, five) == xk::kOk);
        dsep.poison();
        REQUIRE(xk::grouped_matmul(few, type, ne0, ne1, probs.data(), np, dx.as<float>(), dsep.as<float>(), rows,
                                   nullptr, st.s) == xk::kOk);
        st.sync();
        dsep.get(b.data(), b.size() * 4);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
        xk::context_destroy(few);
      }
      for (int i = 0; i < np; ++i) {
        const auto& p = probs[size_t(i)];
        const Ref ref = reference(type, hw[size_t(i)], ne0, ne1, x.data() + p.row * ne0, p.n_tokens);
        std::vector<float> g(a.begin() + p.row * ne1, a.begin() + (p.row + p.n_tokens) * ne1);
        CHECK(count_bad(g, ref, kTolFp32, xk::type_name(type)) == 0);
      }
      // x one float off 16-byte alignment takes the tile path, and so does the
      // fp32_tiles option: both within the same bound.
      std::vector<float> g(size_t(40 * ne1));
      dy.poison();
      REQUIRE(xk::matmul(ctx, type, probs[0].w, ne0, ne1, dx.as<float>() + 1, 40, dy.as<float>(), nullptr, st.s) ==
              xk::kOk);
      st.sync();
      dy.get(g.data(), g.size() * 4);
      CHECK(count_bad(g, reference(type, hw[0], ne0, ne1, x.data() + 1, 40), kTolFp32, xk::type_name(type)) == 0);
      xk::MatmulOptions tiles{};
      tiles.size = sizeof tiles;
      tiles.fp32_tiles = 1;
      dy.poison();
      REQUIRE(xk::matmul(ctx, type, probs[0].w, ne0, ne1, dx.as<float>(), 40, dy.as<float>(), &tiles, st.s) == xk::kOk);
      st.sync();
      dy.get(g.data(), g.size() * 4);
      CHECK(count_bad(g, reference(type, hw[0], ne0, ne1, x.data(), 40), kTolFp32, xk::type_name(type)) == 0);
    }
  }
  xk::context_destroy(ctx);
}

TEST_CASE("matmul: prefill of 77 tokens (fp32 tiles, several tiles) and the bf16 option") {
  std::mt19937 rng(5);
  Stream st;
  const int n = 77;
  xk::Context* big = nullptr;
  REQUIRE(xk::context_create(&big, 0) == xk::kOk);
  for (uint32_t type : kTypes) {
    CAPTURE(xk::type_name(type));
    const int64_t ne0 = xk::block_elems(type) == 1 ? 520 : 3 * 256, ne1 = 45;
    const auto w = random_weights(type, ne0, ne1, rng);
    const auto x = random_x(size_t(n * ne0), rng);
    DevBuf dw(w.size()), dx(x.size() * 4), dy(size_t(n * ne1) * 4);
    dw.put(w.data(), w.size());
    dx.put(x.data(), x.size() * 4);
    const Ref ref = reference(type, w, ne0, ne1, x.data(), n);
    // A workspace of 7 rows: 7 tiles, the last one partial.
    xk::Context* small = nullptr;
    REQUIRE(xk::context_create(&small, size_t(ne0) * 4 * 7) == xk::kOk);
    std::vector<float> got(size_t(n * ne1));
    // F32 weights are read in place unless fp32_tiles forces the tiles; the
    // second stream makes the context hand cuBLAS its stream and workspace again.
    xk::MatmulOptions tiles{};
    tiles.size = sizeof tiles;
    tiles.fp32_tiles = 1;
    Stream other;
    for (xk::Context* c : {big, small}) {
      for (const xk::MatmulOptions* opt : {static_cast<const xk::MatmulOptions*>(nullptr), static_cast<const xk::MatmulOptions*>(&tiles)}) {
        for (cudaStream_t s : {st.s, other.s}) {
          dy.poison();
          REQUIRE(xk::matmul(c, type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), opt, s) == xk::kOk);
          REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
          dy.get(got.data(), got.size() * 4);
          CHECK(count_bad(got, ref, kTolFp32, xk::type_name(type)) == 0);
        }
      }
    }
    xk::MatmulOptions o{};
    o.size = sizeof o;
    o.precision = xk::kPrecisionBf16;
    // The small workspace cannot hold the 77 tokens in bf16 beside a tile: they go in parts.
    dy.poison();
    REQUIRE(xk::matmul(small, type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), &o, st.s) == xk::kOk);
    st.sync();
    dy.get(got.data(), got.size() * 4);
    CHECK(count_bad(got, ref, kTolBf16, xk::type_name(type)) == 0);
    xk::context_destroy(small);
    dy.poison();
    REQUIRE(xk::matmul(big, type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), &o, st.s) == xk::kOk);
    st.sync();
    dy.get(got.data(), got.size() * 4);
    CHECK(count_bad(got, ref, kTolBf16, xk::type_name(type)) == 0);
    // bf16 rounding is visible: the option really changes the computation.
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref.y[i]) / ref.mag[i]);
    CHECK(worst > kTolFp32);
    // Fewer tokens through matmul take the matvec path (and its results), in
    // fp32 whatever the precision asks: the option is a prefill one.
    o.matvec_max_tokens = 3;
    for (int precision : {int(xk::kPrecisionFp32), int(xk::kPrecisionBf16)}) {
      CAPTURE(precision);
      o.precision = precision;
      dy.poison();
      REQUIRE(xk::matmul(big, type, dw.p, ne0, ne1, dx.as<float>(), 3, dy.as<float>(), &o, st.s) == xk::kOk);
      st.sync();
      std::vector<float> g3(size_t(3 * ne1));
      dy.get(g3.data(), g3.size() * 4);
      CHECK(count_bad(g3, head(ref, g3.size()), kTolFp32, xk::type_name(type)) == 0);
    }
  }
  xk::context_destroy(big);
  xk::context_destroy(nullptr);
}

TEST_CASE("matmul of F32 weights: narrow and wide, split over the inputs or not, the same bits every run") {
  std::mt19937 rng(12);
  Stream st;
  xk::Context* big = nullptr;
  REQUIRE(xk::context_create(&big, 0) == xk::kOk);
  struct Shape {
    int64_t ne0, ne1;
    int n;
  };
  // DeepSeek-V4's hyper-connection mixes (24 rows of 16384: split over the
  // inputs), a router of odd width, and one whose inputs end mid-step.
  for (const Shape sh : {Shape{16384, 24, 512}, Shape{4096, 130, 67}, Shape{1000, 7, 9}}) {
    CAPTURE(sh.ne0);
    const auto w = random_weights(xk::kF32, sh.ne0, sh.ne1, rng);
    const auto x = random_x(size_t(sh.n) * size_t(sh.ne0), rng);
    DevBuf dw(w.size()), dx(x.size() * 4), dy(size_t(sh.n * sh.ne1) * 4);
    dw.put(w.data(), w.size());
    dx.put(x.data(), x.size() * 4);
    const Ref ref = reference(xk::kF32, w, sh.ne0, sh.ne1, x.data(), sh.n);
    // A workspace of one row leaves no room for split sums: one part.
    xk::Context* small = nullptr;
    REQUIRE(xk::context_create(&small, size_t(sh.ne0) * 4) == xk::kOk);
    std::vector<float> first;
    for (xk::Context* c : {big, big, small}) {
      std::vector<float> got(size_t(sh.n * sh.ne1));
      dy.poison();
      REQUIRE(xk::matmul(c, xk::kF32, dw.p, sh.ne0, sh.ne1, dx.as<float>(), sh.n, dy.as<float>(), nullptr, st.s) ==
              xk::kOk);
      st.sync();
      dy.get(got.data(), got.size() * 4);
      CHECK(count_bad(got, ref, kTolFp32, "f32") == 0);
      if (first.empty()) first = got;
      else if (c == big) CHECK(std::memcmp(first.data(), got.data(), got.size() * 4) == 0);
    }
    xk::context_destroy(small);
  }
  xk::context_destroy(big);
}

TEST_CASE("grouped launches equal separate launches bit for bit") {
  std::mt19937 rng(6);
  Stream st;
  xk::Context* ctx = nullptr;
  REQUIRE(xk::context_create(&ctx, 0) == xk::kOk);
  for (uint32_t type : kTypes) {
    CAPTURE(xk::type_name(type));
    const int64_t ne0 = int64_t(80) * unit_elems(type), ne1 = 53;
    const int counts[] = {1, 3, 8, 2, 5, 1, 77};  // the last one: a prefill-sized problem
    const int np = 7;
    std::vector<std::unique_ptr<DevBuf>> ws;
    std::vector<xk::ExpertProblem> probs;
    int rows = 0;
    for (int i = 0; i < np; ++i) {
      const auto w = random_weights(type, ne0, ne1, rng);
      ws.push_back(std::make_unique<DevBuf>(w.size()));
      ws.back()->put(w.data(), w.size());
      probs.push_back({ws.back()->p, rows, counts[i]});
      rows += counts[i];
    }
    const auto x = random_x(size_t(rows * ne0), rng);
    DevBuf dx(x.size() * 4), dy(size_t(rows * ne1) * 4), dsep(size_t(rows * ne1) * 4);
    dx.put(x.data(), x.size() * 4);
    // One grouped_matvec launch over the decode-sized problems (MXFP4 also on the
    // tensor cores, in each of their layouts: 2560 inputs are 5 whole groups).
    const size_t dec = size_t(probs[np - 1].row * ne1);
    std::vector<float> a(size_t(rows * ne1)), b(a.size());
    for (int layout = -1; layout < (type == xk::kMXFP4 ? int(std::size(kMmaLayouts)) : 0); ++layout) {
      CAPTURE(layout);
      if (layout >= 0) set_mma_layout(size_t(layout));
      dy.poison();
      REQUIRE(xk::grouped_matvec(type, ne0, ne1, probs.data(), np - 1, dx.as<float>(), dy.as<float>(), rows, st.s) ==
              xk::kOk);
      dsep.poison();
      for (int i = 0; i < np - 1; ++i)
        REQUIRE(xk::matvec(type, probs[size_t(i)].w, ne0, ne1, dx.as<float>() + probs[size_t(i)].row * ne0,
                           probs[size_t(i)].n_tokens, dsep.as<float>() + probs[size_t(i)].row * ne1, st.s) == xk::kOk);
      st.sync();
      xk::dev::set_matvec_geometry(0, true);
      dy.get(a.data(), dec * 4);
      dsep.get(b.data(), dec * 4);
      CHECK(std::memcmp(a.data(), b.data(), dec * 4) == 0);
    }
    // grouped_matmul over all of them (the 77-token one through the GEMM path;
    // for the types with a tensor-core path the ones of more than 4 tokens)
    // equals matmul() of each.
    dy.poison();
    REQUIRE(xk::grouped_matmul(ctx, type, ne0, ne1, probs.data(), np, dx.as<float>(), dy.as<float>(), rows, nullptr, st.s) == xk::kOk);
    dsep.poison();
    for (const auto& p : probs)
      REQUIRE(xk::matmul(ctx, type, p.w, ne0, ne1, dx.as<float>() + p.row * ne0, p.n_tokens,
                         dsep.as<float>() + p.row * ne1, nullptr, st.s) == xk::kOk);
    st.sync();
    dy.get(a.data(), a.size() * 4);
    dsep.get(b.data(), b.size() * 4);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    // And the grouped results are right, not only equal.
    for (int i : {0, 2, 6}) {
      std::vector<uint8_t> w(ws[size_t(i)]->n);
      ws[size_t(i)]->get(w.data(), w.size());
      const int nt = probs[size_t(i)].n_tokens;
      const Ref ref = reference(type, w, ne0, ne1, x.data() + probs[size_t(i)].row * ne0, nt);
      std::vector<float> g(a.begin() + probs[size_t(i)].row * ne1, a.begin() + (probs[size_t(i)].row + nt) * ne1);
      CHECK(count_bad(g, ref, kTolFp32, xk::type_name(type)) == 0);
    }
  }
  xk::context_destroy(ctx);
}

// Rows of a [n][ne1] result, as floats.
std::vector<float> fetch(const DevBuf& d, size_t n) {
  std::vector<float> v(n);
  d.get(v.data(), n * 4);
  return v;
}

// MXFP4 decode by default (kMmaDecodeAuto): each problem goes to the tensor cores or
// the dp4a unit by its shape and token count. At 7168 inputs, 8192 rows fill 97 % of
// the rounds of an H100's or H200's 528 concurrent tiles (the rule takes them at one
// token), 1000 and 24 rows far less (the tensor cores from two tokens on, in 16 x
// 1): each product's result is bit for bit what one of the two kernels gives forced
// (in the default layout), within the bound; products of one input split between
// the kernels and layouts equal their launches alone, also at 8 tokens, whose terms
// the dp4a launch stages in passes of fewer tokens (7168 inputs: 32 KB a token); and
// a grouped launch of problems of 1, 3 and 8 tokens with a scratch (the one-token
// problem on other units, the others sliced) equals each problem's launch alone.
TEST_CASE("MXFP4 decode: the default kernel is chosen by the shape and token count; grouped and shared launches keep their bits") {
  std::mt19937 rng(14);
  Stream st;
  const int64_t ne0 = 7168, rows[] = {8192, 1000, 24};
  const int np = 3;
  std::vector<std::vector<uint8_t>> hw;
  std::vector<std::unique_ptr<DevBuf>> ws;
  for (int i = 0; i < np; ++i) {
    hw.push_back(random_weights(xk::kMXFP4, ne0, rows[i], rng));
    ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
    ws.back()->put(hw.back().data(), hw.back().size());
  }
  const auto x = random_x(size_t(12) * size_t(ne0), rng);
  DevBuf dx(x.size() * 4);
  dx.put(x.data(), x.size() * 4);
  int on_tensor_cores = 0, more_on_tensor_cores = 0;
  for (const int n : {1, 3, 8}) {
    CAPTURE(n);
    std::vector<std::vector<float>> alone(np);
    for (int i = 0; i < np; ++i) {
      CAPTURE(rows[i]);
      DevBuf dy(size_t(n * rows[i]) * 4);
      const size_t m = size_t(n * rows[i]);
      std::vector<float> forced[2];
      for (const int mode : {xk::dev::kMmaDecodeAlways, xk::dev::kMmaDecodeNever, xk::dev::kMmaDecodeAuto}) {
        xk::dev::set_matvec_geometry(0, true, 0, true, mode);
        dy.poison();
        REQUIRE(xk::matvec(xk::kMXFP4, ws[size_t(i)]->p, ne0, rows[i], dx.as<float>(), n, dy.as<float>(), st.s) ==
                xk::kOk);
        st.sync();
        auto y = fetch(dy, m);
        if (mode != xk::dev::kMmaDecodeAuto) {
          forced[mode == xk::dev::kMmaDecodeAlways ? 0 : 1] = y;
          continue;
        }
        const bool mma = std::memcmp(y.data(), forced[0].data(), m * 4) == 0;
        CHECK((mma || std::memcmp(y.data(), forced[1].data(), m * 4) == 0));
        on_tensor_cores += mma && n == 1;
        more_on_tensor_cores += mma && n > 1;
        const Ref ref = reference(xk::kMXFP4, hw[size_t(i)], ne0, rows[i], x.data(), n);
        CHECK(count_bad(y, ref, kTolFp32, "mxfp4, the default kernel") == 0);
        alone[size_t(i)] = std::move(y);
      }
    }
    // The three products as one list of products of one input (the default kernels).
    std::vector<std::unique_ptr<DevBuf>> ys;
    std::vector<xk::SharedInputProduct> ps;
    for (int i = 0; i < np; ++i) {
      ys.push_back(std::make_unique<DevBuf>(size_t(n * rows[i]) * 4));
      ys.back()->poison();
      ps.push_back({ws[size_t(i)]->p, rows[i], ys.back()->as<float>()});
    }
    REQUIRE(xk::dev::shared_input_matvec(xk::kMXFP4, ne0, ps.data(), np, dx.as<float>(), n, st.s) == xk::kOk);
    st.sync();
    for (int i = 0; i < np; ++i) {
      CAPTURE(rows[i]);
      const size_t m = size_t(n * rows[i]);
      CHECK(std::memcmp(fetch(*ys[size_t(i)], m).data(), alone[size_t(i)].data(), m * 4) == 0);
    }
  }
  MESSAGE("products the default put on the tensor cores at one token: " << on_tensor_cores << " of " << np);
  CHECK(more_on_tensor_cores == 2 * np);
  // Grouped: problems of 1, 3 and 8 tokens (x's rows 0, 1..3, 4..11) on one matrix.
  const size_t room = size_t(4) << 20;
  DevBuf scratch(room);
  const xk::dev::MatvecScratch sc{scratch.as<float>(), room, nullptr, 0};
  for (int i = 0; i < 2; ++i) {
    CAPTURE(rows[i]);
    const xk::ExpertProblem probs[3] = {{ws[size_t(i)]->p, 0, 1}, {ws[size_t(i)]->p, 1, 3}, {ws[size_t(i)]->p, 4, 8}};
    const size_t m = size_t(12 * rows[i]);
    DevBuf dy(m * 4), dsep(m * 4);
    dy.poison();
    dsep.poison();
    REQUIRE(xk::dev::grouped_matvec_scratch(&sc, xk::kMXFP4, ne0, rows[i], probs, 3, dx.as<float>(), dy.as<float>(),
                                            12, st.s) == xk::kOk);
    for (const auto& p : probs)
      REQUIRE(xk::dev::grouped_matvec_scratch(&sc, xk::kMXFP4, ne0, rows[i], &p, 1, dx.as<float>(), dsep.as<float>(),
                                              12, st.s) == xk::kOk);
    st.sync();
    const auto a = fetch(dy, m), b = fetch(dsep, m);
    CHECK(std::memcmp(a.data(), b.data(), m * 4) == 0);
    const Ref ref = reference(xk::kMXFP4, hw[size_t(i)], ne0, rows[i], x.data(), 12);
    CHECK(count_bad(a, ref, kTolFp32, "mxfp4 grouped, the default kernels") == 0);
  }
  xk::dev::set_matvec_geometry(0, true);
}

// The K-quants' products of one input (Kimi-K3's MLA and KDA projections): each
// product's rows equal its matvec() alone bit for bit, at 1, 3 and 8 tokens (7168
// inputs: the dp4a launch stages 8 tokens' terms in passes), and keep the bound.
TEST_CASE("matvec: K-quant products of one input equal their launches alone") {
  std::mt19937 rng(15);
  Stream st;
  const int64_t ne0 = 7168, rows[] = {300, 37, 8};
  const int np = 3;
  const auto x = random_x(size_t(8) * size_t(ne0), rng);
  DevBuf dx(x.size() * 4);
  dx.put(x.data(), x.size() * 4);
  for (uint32_t type : {xk::kQ2_K, xk::kQ3_K, xk::kQ4_K, xk::kQ5_K, xk::kQ6_K}) {
    CAPTURE(xk::type_name(type));
    std::vector<std::vector<uint8_t>> hw;
    std::vector<std::unique_ptr<DevBuf>> ws, ys;
    for (int i = 0; i < np; ++i) {
      hw.push_back(random_weights(type, ne0, rows[i], rng));
      ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
      ws.back()->put(hw.back().data(), hw.back().size());
      ys.push_back(std::make_unique<DevBuf>(size_t(8 * rows[i]) * 4));
    }
    for (const int n : {1, 3, 8}) {
      CAPTURE(n);
      std::vector<xk::SharedInputProduct> ps;
      for (int i = 0; i < np; ++i) {
        ys[size_t(i)]->poison();
        ps.push_back({ws[size_t(i)]->p, rows[i], ys[size_t(i)]->as<float>()});
      }
      REQUIRE(xk::dev::shared_input_matvec(type, ne0, ps.data(), np, dx.as<float>(), n, st.s) == xk::kOk);
      st.sync();
      for (int i = 0; i < np; ++i) {
        CAPTURE(rows[i]);
        const size_t m = size_t(n * rows[i]);
        const auto together = fetch(*ys[size_t(i)], m);
        const auto alone = matvec_y(st, type, *ws[size_t(i)], ne0, rows[i], dx, n, *ys[size_t(i)]);
        CHECK(std::memcmp(together.data(), alone.data(), m * 4) == 0);
        CHECK(count_bad(alone, reference(type, hw[size_t(i)], ne0, rows[i], x.data(), n), kTolFp32,
                        xk::type_name(type)) == 0);
      }
    }
  }
}

// x made once per launch into a scratch where it has room (the dp4a units'
// stage_terms_kernel, the tensor cores' stage_launch_kernel), else by each block
// itself: the same bytes, so the same bits. MadeOnce builds a grouped launch of
// three problems of 1, 3 and 8 tokens and the products of one input (the three
// matrices on x's first 8 rows), runs both without a scratch (within the bound),
// then check_scratches runs them with a scratch of room (the same bits, the scratch
// written: x was made there), one byte short and with the switch off (the same
// bits, the scratch untouched), and the first problem alone at one token (the same
// bits; the scratch written by default only where single_by_default, and always
// with kPrestageAlways). geometry(prestage) sets the path under test.
struct MadeOnce {
  enum Launch { kGrouped, kShared, kSingle };
  static constexpr int kCounts[3] = {1, 3, 8};
  static constexpr int kNp = 3, kRows = 1 + 3 + 8;
  const Stream& st;
  uint32_t type;
  int64_t ne0, ne1;
  std::function<void(int)> geometry;
  std::vector<std::vector<uint8_t>> hw;
  std::vector<std::unique_ptr<DevBuf>> ws, ys;
  std::vector<xk::ExpertProblem> probs;
  std::vector<xk::SharedInputProduct> ps;
  std::vector<float> x, own;
  std::vector<std::vector<float>> shared_own;
  DevBuf dx, dy;

  MadeOnce(std::mt19937& rng, const Stream& s, uint32_t t, int64_t n0, int64_t n1, std::function<void(int)> geom)
      : st(s), type(t), ne0(n0), ne1(n1), geometry(std::move(geom)), dx(size_t(kRows * n0) * 4),
        dy(size_t(kRows * n1) * 4) {
    for (int i = 0, row = 0; i < kNp; row += kCounts[i], ++i) {
      hw.push_back(random_weights(type, ne0, ne1, rng));
      ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
      ws.back()->put(hw.back().data(), hw.back().size());
      probs.push_back({ws.back()->p, row, kCounts[i]});
      ys.push_back(std::make_unique<DevBuf>(size_t(8 * ne1) * 4));
      ps.push_back({ws.back()->p, ne1, ys.back()->as<float>()});
    }
    x = random_x(size_t(kRows) * size_t(ne0), rng);
    dx.put(x.data(), x.size() * 4);
    geometry(xk::dev::kPrestageAuto);
    own = grouped(nullptr, kNp);
    for (int i = 0; i < kNp; ++i) {
      const auto& p = probs[size_t(i)];
      const std::vector<float> g(own.begin() + p.row * ne1, own.begin() + (p.row + p.n_tokens) * ne1);
      CHECK(count_bad(g, reference(type, hw[size_t(i)], ne0, ne1, x.data() + p.row * ne0, p.n_tokens), kTolFp32,
                      xk::type_name(type)) == 0);
    }
    shared_own = shared(nullptr);
    xk::dev::set_matvec_geometry(0, true);
  }
  std::vector<float> grouped(const xk::dev::MatvecScratch* sc, int n) {
    dy.poison();
    REQUIRE(xk::dev::grouped_matvec_scratch(sc, type, ne0, ne1, probs.data(), n, dx.as<float>(), dy.as<float>(),
                                            kRows, st.s) == xk::kOk);
    st.sync();
    return fetch(dy, size_t(kRows * ne1));
  }
  std::vector<std::vector<float>> shared(const xk::dev::MatvecScratch* sc) {
    for (auto& y : ys) y->poison();
    REQUIRE(xk::dev::shared_input_matvec(type, ne0, ps.data(), kNp, dx.as<float>(), 8, st.s, sc) == xk::kOk);
    st.sync();
    std::vector<std::vector<float>> out;
    for (auto& y : ys) out.push_back(fetch(*y, size_t(8 * ne1)));
    return out;
  }
  // need(launch): the scratch x takes there; counters: the split's (may be null).
  void check_scratches(const std::function<size_t(Launch)>& need, uint32_t* counters, size_t n_counters,
                       bool single_by_default) {
    for (const int mode : {0, 1, 2}) {  // room, one byte short, the switch off
      CAPTURE(mode);
      for (const Launch launch : {kGrouped, kShared, kSingle}) {
        CAPTURE(int(launch));
        for (const int always : {0, 1}) {
          if (always && (launch != kSingle || mode != 0)) continue;
          CAPTURE(always);
          const size_t room = need(launch);
          DevBuf scratch(room);
          check_cuda(cudaMemset(scratch.p, 0xA5, scratch.n));
          check_cuda(cudaDeviceSynchronize());
          const xk::dev::MatvecScratch sc{scratch.as<float>(), mode == 1 ? room - 1 : room, counters, n_counters};
          geometry(mode == 2 ? xk::dev::kPrestageNever : always ? xk::dev::kPrestageAlways : xk::dev::kPrestageAuto);
          if (launch == kShared) {
            const auto got = shared(&sc);
            for (int i = 0; i < kNp; ++i)
              CHECK(std::memcmp(got[size_t(i)].data(), shared_own[size_t(i)].data(), size_t(8 * ne1) * 4) == 0);
          } else {
            const auto got = grouped(&sc, launch == kSingle ? 1 : kNp);
            const size_t m = size_t(launch == kSingle ? 1 : kRows) * size_t(ne1);
            CHECK(std::memcmp(got.data(), own.data(), m * 4) == 0);
          }
          xk::dev::set_matvec_geometry(0, true);
          std::vector<uint8_t> after(room);
          scratch.get(after.data(), room);
          const bool untouched = std::all_of(after.begin(), after.end(), [](uint8_t b) { return b == 0xA5; });
          const bool used = mode == 0 && (launch != kSingle || always || single_by_default);
          CHECK(untouched == !used);
        }
      }
    }
  }
};

// The dp4a units, every type at 7168 inputs (8 tokens' terms go in passes) and
// 2560. A staged unit takes 560 bytes for 128 inputs (the K-quants), 144 for 32
// (MXFP4), a token; at one token the terms are made once by default only for rows
// of 8192 inputs and more (neither length here).
TEST_CASE("dp4a decode: x's terms made once per launch equal each block's own, bit for bit") {
  std::mt19937 rng(16);
  Stream st;
  DevBuf counters(xk::dev::kMatvecSplitCounters * 4);
  check_cuda(cudaMemset(counters.p, 0, counters.n));
  check_cuda(cudaDeviceSynchronize());
  for (uint32_t type : {xk::kQ2_K, xk::kQ3_K, xk::kQ4_K, xk::kQ5_K, xk::kQ6_K, xk::kMXFP4}) {
    for (const int64_t ne0 : {int64_t(7168), int64_t(2560)}) {
      CAPTURE(xk::type_name(type));
      CAPTURE(ne0);
      const size_t token_bytes = type == xk::kMXFP4 ? size_t(ne0 / 32) * 144 : size_t(ne0 / 128) * 560;
      MadeOnce c(rng, st, type, ne0, 37, [](int prestage) {
        // MXFP4's tensor cores off: they take rows of 7168 inputs from two tokens on.
        xk::dev::set_matvec_geometry(0, true, 0, true, xk::dev::kMmaDecodeNever, 0, 0, true, prestage);
        // A launch with a scratch would take Q2_K's and Q3_K's tensor cores where one without cannot.
        xk::dev::set_kq_mma(xk::dev::kMmaDecodeNever);
      });
      c.check_scratches(
          [&](MadeOnce::Launch l) {
            return size_t(l == MadeOnce::kGrouped ? MadeOnce::kRows : l == MadeOnce::kShared ? 8 : 1) * token_bytes;
          },
          counters.as<uint32_t>(), xk::dev::kMatvecSplitCounters, ne0 >= 8192);
    }
  }
  xk::dev::set_kq_mma(xk::dev::kMmaDecodeAuto);
}

// The MXFP4 tensor-core decode (forced on, rows of 7168 and 2560 inputs; no split
// counters, so the few rows are not split): its staged x takes 164 bytes a 32-input
// chunk and token at eight tokens (the launch's count rounded up), a problem's
// (products of one input: one) after another, and 132 at one token (no C
// fragments); made once by default from two tokens on. And two int8 products a
// block and pair of tokens (the one-token form) instead of one give the same bits too.
TEST_CASE("tensor-core MXFP4 decode: x made once per launch equals each block's own, bit for bit") {
  std::mt19937 rng(17);
  Stream st;
  for (const int64_t ne0 : {int64_t(7168), int64_t(2560)}) {
    CAPTURE(ne0);
    // One layout for every token count (by default the layout may differ between
    // one token and more, which sends a grouped launch's one-token problem apart).
    const auto mma = [](int prestage, bool one_product) {
      xk::dev::set_matvec_geometry(0, true, 0, true, xk::dev::kMmaDecodeAlways, 4, 4, true, prestage, one_product);
    };
    MadeOnce c(rng, st, xk::kMXFP4, ne0, 40, [&](int prestage) { mma(prestage, true); });
    c.check_scratches(
        [&](MadeOnce::Launch l) {
          const size_t units = size_t(ne0 / 32);
          return l == MadeOnce::kGrouped ? MadeOnce::kNp * units * 164 * 8
                 : l == MadeOnce::kShared ? units * 164 * 8
                                          : units * 132;
        },
        nullptr, 0, false);
    mma(xk::dev::kPrestageAuto, false);
    const auto two = c.grouped(nullptr, MadeOnce::kNp);
    xk::dev::set_matvec_geometry(0, true);
    CHECK(std::memcmp(two.data(), c.own.data(), two.size() * 4) == 0);
  }
}

// The tensor-core MXFP4 decode sliced (set_mma_slices: each block one k-split of
// 16 tiles, the warps' sums added by a second launch in the unsliced block's
// order) gives the unsliced launch's bits, in the two layouts of 16 warps a block:
// a grouped launch of problems of 1, 3 and 8 tokens, products of one input at 8,
// and one problem at one token. 7168 inputs are 14 groups of 512 (4 x 4: 4, 4, 3
// and 3 groups a k-split; 16 x 1: two k-splits with none) and 28672 are 56 (16 x 1: 3
// or 4 a k-split); at eight tokens a 16-warp block stages at most 3 or 4 groups at
// once (1312 bytes a chunk), so a k-split's groups also go in segments. 300 rows
// make 19 tiles, the last partial: two sets of 16 tiles, the second mostly idle.
// The run is sliced where the scratch's bytes after x's got written, and that must
// happen once it has room; with the switch off they stay as they were.
TEST_CASE("tensor-core MXFP4 decode: sliced launches equal unsliced ones bit for bit") {
  std::mt19937 rng(61);
  Stream st;
  constexpr int kCounts[3] = {1, 3, 8};
  constexpr int kRows = 1 + 3 + 8;
  for (const int64_t ne0 : {int64_t(7168), int64_t(28672)}) {
    const int64_t ne1 = 300;
    CAPTURE(ne0);
    std::vector<std::vector<uint8_t>> hw;
    std::vector<std::unique_ptr<DevBuf>> ws, ys;
    std::vector<xk::ExpertProblem> probs;
    std::vector<xk::SharedInputProduct> ps;
    for (int i = 0, row = 0; i < 3; row += kCounts[i], ++i) {
      hw.push_back(random_weights(xk::kMXFP4, ne0, ne1, rng));
      ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
      ws.back()->put(hw.back().data(), hw.back().size());
      probs.push_back({ws.back()->p, row, kCounts[i]});
      ys.push_back(std::make_unique<DevBuf>(size_t(8 * ne1) * 4));
      ps.push_back({ws.back()->p, ne1 - 17 * i, ys.back()->as<float>()});  // 300, 283, 266 rows
    }
    const auto x = random_x(size_t(kRows) * size_t(ne0), rng);
    DevBuf dx(x.size() * 4), dy(size_t(kRows * ne1) * 4);
    dx.put(x.data(), x.size() * 4);
    // x takes 1312 bytes a chunk at eight tokens and 132 at one, a problem's (products
    // of one input: one) after another; the warps' sums follow at the next 256
    // bytes, 16 a row and token at most (4 x 4: 4).
    const auto sums_at = [&](int launch) {
      const size_t x_bytes = size_t(launch == 0 ? 3 : 1) * size_t(ne0 / 32) * (launch == 2 ? 132 : 1312);
      return (x_bytes + 255) / 256 * 256;
    };
    const size_t room = sums_at(0) + size_t(3) * 16 * 304 * 8 * 4;
    DevBuf scratch(room);
    const xk::dev::MatvecScratch sc{scratch.as<float>(), room, nullptr, 0};
    for (size_t l : {size_t(1), size_t(3)}) {  // 4 x 4, 16 x 1
      CAPTURE(kMmaLayouts[l][0]);
      for (const int launch : {0, 1, 2}) {  // grouped, products of one input, one problem
        CAPTURE(launch);
        std::vector<float> runs[2];
        bool wrote[2] = {};
        for (const int mode : {xk::dev::kSwitchOff, xk::dev::kSwitchOn}) {
          set_mma_layout(l);
          xk::dev::set_mma_slices(mode);
          check_cuda(cudaMemset(scratch.p, 0xA5, scratch.n));
          check_cuda(cudaDeviceSynchronize());
          std::vector<float> got;
          if (launch == 1) {
            for (auto& y : ys) y->poison();
            REQUIRE(xk::dev::shared_input_matvec(xk::kMXFP4, ne0, ps.data(), 3, dx.as<float>(), 8, st.s, &sc) ==
                    xk::kOk);
            st.sync();
            for (int i = 0; i < 3; ++i) {
              const auto y = fetch(*ys[size_t(i)], size_t(8 * ps[size_t(i)].ne1));
              got.insert(got.end(), y.begin(), y.end());
            }
          } else {
            dy.poison();
            REQUIRE(xk::dev::grouped_matvec_scratch(&sc, xk::kMXFP4, ne0, ne1, probs.data(), launch == 0 ? 3 : 1,
                                                    dx.as<float>(), dy.as<float>(), kRows, st.s) == xk::kOk);
            st.sync();
            got = fetch(dy, size_t(launch == 0 ? kRows : 1) * size_t(ne1));
          }
          xk::dev::set_mma_slices(xk::dev::kSwitchAuto);
          xk::dev::set_matvec_geometry(0, true);
          const size_t at = sums_at(launch);
          std::vector<uint8_t> after(room - at);
          check_cuda(cudaMemcpy(after.data(), static_cast<uint8_t*>(scratch.p) + at, after.size(),
                                cudaMemcpyDeviceToHost));
          wrote[mode == xk::dev::kSwitchOn] =
              std::any_of(after.begin(), after.end(), [](uint8_t b) { return b != 0xA5; });
          runs[mode == xk::dev::kSwitchOn] = std::move(got);
        }
        CHECK_FALSE(wrote[0]);
        CHECK(wrote[1]);
        REQUIRE(runs[0].size() == runs[1].size());
        CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4) == 0);
        if (launch == 0) {
          for (int i = 0; i < 3; ++i) {
            const auto& p = probs[size_t(i)];
            const std::vector<float> g(runs[1].begin() + p.row * ne1, runs[1].begin() + (p.row + p.n_tokens) * ne1);
            CHECK(count_bad(g, reference(xk::kMXFP4, hw[size_t(i)], ne0, ne1, x.data() + p.row * ne0, p.n_tokens),
                            kTolFp32, "mxfp4 sliced") == 0);
          }
        }
      }
    }
  }
}

// Matrices of 24, 4 and 1 rows of 16384 inputs (32768 for Q2_K, Q3_K and Q6_K,
// whose rows need 256 units to split) fill too few blocks for the GPU,
// so matmul() splits their rows over more warps (chunk sums in the context's
// workspace, added in a fixed order): within the fp32 bound for every type at
// 1..3 tokens; the same bits on a second launch (which also finds the first's
// counters reset); not the bits of the unsplit matvec() somewhere (the split did
// run: any GPU with more than 6 SMs splits these shapes); and exactly matvec()'s
// bits with a workspace too small for any split's partial sums (32 bytes: one
// row's 8 tokens x 2 chunks need 64; the fallback). F32, F16
// and BF16 also at 16381 inputs (the one-element path).
TEST_CASE("matmul at decode: few-row matrices split their rows, within the bound, the same bits every run") {
  std::mt19937 rng(9);
  Stream st;
  xk::Context* ctx = nullptr;
  xk::Context* tiny = nullptr;
  REQUIRE(xk::context_create(&ctx, 0) == xk::kOk);
  REQUIRE(xk::context_create(&tiny, 32) == xk::kOk);
  struct Case {
    uint32_t type;
    int64_t ne0;
  };
  std::vector<Case> cases;
  // 256 units per row at least: 32768 inputs for the types of 128-element units.
  for (uint32_t type : kTypes)
    cases.push_back({type, type == xk::kQ2_K || type == xk::kQ3_K || type == xk::kQ6_K ? 32768 : 16384});
  for (uint32_t type : {xk::kF32, xk::kF16, xk::kBF16}) cases.push_back({type, 16381});
  for (const Case& c : cases) {
    const uint32_t type = c.type;
    const int64_t ne0 = c.ne0, rows = 24;
    CAPTURE(xk::type_name(type));
    CAPTURE(ne0);
    // One 24-row matrix; its first 4 rows and its first row are the smaller ones.
    const auto w = random_weights(type, ne0, rows, rng);
    const auto x = random_x(size_t(3 * ne0), rng);
    DevBuf dw(w.size()), dx(x.size() * 4), dy(size_t(3 * rows) * 4);
    dw.put(w.data(), w.size());
    dx.put(x.data(), x.size() * 4);
    const Ref ref = reference(type, w, ne0, rows, x.data(), 3);
    int differ = 0;
    for (const int64_t ne1 : {int64_t(24), int64_t(4), int64_t(1)})
      for (int n = 1; n <= 3; ++n) {
        CAPTURE(ne1);
        CAPTURE(n);
        const size_t m = size_t(n * ne1);
        dy.poison();
        REQUIRE(xk::matmul(ctx, type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), nullptr, st.s) == xk::kOk);
        st.sync();
        const auto first = fetch(dy, m);
        Ref r;
        for (int t = 0; t < n; ++t)
          for (int64_t o = 0; o < ne1; ++o) {
            r.y.push_back(ref.y[size_t(t * rows + o)]);
            r.mag.push_back(ref.mag[size_t(t * rows + o)]);
          }
        CHECK(count_bad(first, r, kTolFp32, xk::type_name(type)) == 0);
        dy.poison();
        REQUIRE(xk::matmul(ctx, type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), nullptr, st.s) == xk::kOk);
        st.sync();
        CHECK(std::memcmp(fetch(dy, m).data(), first.data(), m * 4) == 0);
        dy.poison();
        REQUIRE(xk::matvec(type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), st.s) == xk::kOk);
        st.sync();
        const auto unsplit = fetch(dy, m);
        for (size_t i = 0; i < m; ++i) differ += std::memcmp(&unsplit[i], &first[i], 4) != 0;
        dy.poison();
        REQUIRE(xk::matmul(tiny, type, dw.p, ne0, ne1, dx.as<float>(), n, dy.as<float>(), nullptr, st.s) == xk::kOk);
        st.sync();
        CHECK(std::memcmp(fetch(dy, m).data(), unsplit.data(), m * 4) == 0);
      }
    CHECK(differ > 0);
  }
  xk::context_destroy(tiny);
  xk::context_destroy(ctx);
}

// A grouped product's inputs: n_weights random matrices on the device, problem i
// of counts[i] tokens taking matrix i % n_weights, its rows after the last's, and x
// for all of them (host and device).
struct ExpertBatch {
  std::vector<std::vector<uint8_t>> hw;
  std::vector<std::unique_ptr<DevBuf>> ws;
  std::vector<xk::ExpertProblem> probs;
  std::vector<float> x;
  int rows = 0;
  std::unique_ptr<DevBuf> dx;
  ExpertBatch(uint32_t type, int64_t ne0, int64_t ne1, int n_weights, const int* counts, int np, std::mt19937& rng) {
    for (int i = 0; i < n_weights; ++i) {
      hw.push_back(random_weights(type, ne0, ne1, rng));
      ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
      ws.back()->put(hw.back().data(), hw.back().size());
    }
    for (int i = 0; i < np; ++i) {
      probs.push_back({ws[size_t(i % n_weights)]->p, rows, counts[i]});
      rows += counts[i];
    }
    x = random_x(size_t(rows) * size_t(ne0), rng);
    dx = std::make_unique<DevBuf>(x.size() * 4);
    dx->put(x.data(), x.size() * 4);
  }
};

// grouped_matmul over 12 few-row problems of 1..3 tokens (four weight matrices in
// turn) equals matmul() of each alone, bit for bit: with the default workspace
// (one launch), with 192 KiB (the split in several launches where fewer problems'
// partial sums fit: F32 at 24 rows) and with 32 bytes (no split at all), for
// every type.
TEST_CASE("grouped_matmul of few-row problems equals separate matmul bit for bit, whatever the workspace") {
  std::mt19937 rng(10);
  Stream st;
  xk::Context* ctxs[3] = {};
  REQUIRE(xk::context_create(&ctxs[0], 0) == xk::kOk);
  REQUIRE(xk::context_create(&ctxs[1], size_t(192) << 10) == xk::kOk);
  REQUIRE(xk::context_create(&ctxs[2], 32) == xk::kOk);
  const int counts[] = {1, 2, 3, 1, 3, 2, 1, 1, 2, 3, 3, 1};
  const int np = 12;
  for (uint32_t type : kTypes) {
    CAPTURE(xk::type_name(type));
    const int64_t ne0 = 16384;
    for (const int64_t ne1 : {int64_t(24), int64_t(4), int64_t(1)}) {
      CAPTURE(ne1);
      const ExpertBatch eb(type, ne0, ne1, 4, counts, np, rng);
      const auto& hw = eb.hw;
      const auto& probs = eb.probs;
      const auto& x = eb.x;
      const int rows = eb.rows;
      const DevBuf& dx = *eb.dx;
      const size_t m = size_t(rows * ne1);
      DevBuf dy(m * 4), dsep(m * 4);
      for (xk::Context* ctx : ctxs) {
        dy.poison();
        REQUIRE(xk::grouped_matmul(ctx, type, ne0, ne1, probs.data(), np, dx.as<float>(), dy.as<float>(), rows,
                                   nullptr, st.s) == xk::kOk);
        dsep.poison();
        for (const auto& p : probs)
          REQUIRE(xk::matmul(ctx, type, p.w, ne0, ne1, dx.as<float>() + p.row * ne0, p.n_tokens,
                             dsep.as<float>() + p.row * ne1, nullptr, st.s) == xk::kOk);
        st.sync();
        const auto a = fetch(dy, m), b = fetch(dsep, m);
        CHECK(std::memcmp(a.data(), b.data(), m * 4) == 0);
        for (int i : {0, 4, 11}) {
          const auto& p = probs[size_t(i)];
          const Ref ref = reference(type, hw[size_t(i % 4)], ne0, ne1, x.data() + p.row * ne0, p.n_tokens);
          std::vector<float> g(a.begin() + p.row * ne1, a.begin() + (p.row + p.n_tokens) * ne1);
          CHECK(count_bad(g, ref, kTolFp32, xk::type_name(type)) == 0);
        }
      }
    }
  }
  for (xk::Context* c : ctxs) xk::context_destroy(c);
}

// shared_input_matmul over products of one x with different row counts (24
// rows, which the default workspace splits for the types with 32- or 8-element
// units, so that product goes through matmul(); 1, 5, 130 and 1000 rows in the
// one launch) equals matmul() of each alone, bit for bit, at 1, 2, 3 and 8
// tokens (3 and 8: the tensor-core path for the types that have one), for every
// type (its bad input: "bad input is refused and writes nothing").
TEST_CASE("shared_input_matmul equals matmul of each product alone, bit for bit") {
  std::mt19937 rng(12);
  Stream st;
  xk::Context* ctx = nullptr;
  REQUIRE(xk::context_create(&ctx, 0) == xk::kOk);
  const int64_t rows[] = {24, 1, 5, 130, 1000};
  const int np = 5;
  for (uint32_t type : kTypes) {
    CAPTURE(xk::type_name(type));
    const int64_t ne0 = 8192;
    std::vector<std::vector<uint8_t>> hw;
    std::vector<std::unique_ptr<DevBuf>> ws;
    for (int i = 0; i < np; ++i) {
      hw.push_back(random_weights(type, ne0, rows[i], rng));
      ws.push_back(std::make_unique<DevBuf>(hw.back().size()));
      ws.back()->put(hw.back().data(), hw.back().size());
    }
    const auto x = random_x(size_t(8) * size_t(ne0), rng);
    DevBuf dx(x.size() * 4);
    dx.put(x.data(), x.size() * 4);
    for (const int n : {1, 2, 3, 8}) {
      CAPTURE(n);
      std::vector<std::unique_ptr<DevBuf>> ys, seps;
      std::vector<xk::SharedInputProduct> ps;
      for (int i = 0; i < np; ++i) {
        ys.push_back(std::make_unique<DevBuf>(size_t(n * rows[i]) * 4));
        seps.push_back(std::make_unique<DevBuf>(size_t(n * rows[i]) * 4));
        ys.back()->poison();
        seps.back()->poison();
        ps.push_back({ws[size_t(i)]->p, rows[i], ys.back()->as<float>()});
      }
      REQUIRE(xk::shared_input_matmul(ctx, type, ne0, ps.data(), np, dx.as<float>(), n, nullptr, st.s) == xk::kOk);
      for (int i = 0; i < np; ++i)
        REQUIRE(xk::matmul(ctx, type, ws[size_t(i)]->p, ne0, rows[i], dx.as<float>(), n, seps[size_t(i)]->as<float>(),
                           nullptr, st.s) == xk::kOk);
      st.sync();
      for (int i = 0; i < np; ++i) {
        CAPTURE(rows[i]);
        const size_t m = size_t(n * rows[i]);
        const auto a = fetch(*ys[size_t(i)], m), b = fetch(*seps[size_t(i)], m);
        CHECK(std::memcmp(a.data(), b.data(), m * 4) == 0);
      }
      // Against the CPU reference too: one product is enough to catch a wrong
      // row or output mapping that the comparison above would share.
      const Ref ref = reference(type, hw[3], ne0, rows[3], x.data(), n);
      CHECK(count_bad(fetch(*ys[3], size_t(n * rows[3])), ref, kTolFp32, xk::type_name(type)) == 0);
    }
  }
  xk::context_destroy(ctx);
}

// With the tensor cores on for Q2_K and Q3_K at every token count (set_kq_mma) and
// by their rule (the default, which judges each problem by its own token count and
// the workspace's room), grouped_matmul of problems of 1-8 tokens equals matmul of
// each alone bit for bit, whatever the workspace (the default; 160 KB, which holds 7168 inputs' x staged for two tokens
// but not for four; 32 bytes, none), and so does shared_input_matmul; both within
// the bound.
TEST_CASE("K-quants on the tensor cores: grouped and shared-input launches equal launches alone") {
  std::mt19937 rng(67);
  Stream st;
  xk::Context* ctxs[3] = {};
  REQUIRE(xk::context_create(&ctxs[0], 0) == xk::kOk);
  REQUIRE(xk::context_create(&ctxs[1], size_t(160) << 10) == xk::kOk);
  REQUIRE(xk::context_create(&ctxs[2], 32) == xk::kOk);
  const int counts[] = {1, 2, 3, 8, 1, 5, 2, 4};
  const int np = 8;
  const int64_t ne0 = 7168, ne1 = 40;
  xk::MatmulOptions dec{};  // the decode kernels up to 8 tokens, as xpack-run's trunk products
  dec.size = sizeof dec;
  dec.matvec_max_tokens = 8;
  for (const int mode : {xk::dev::kMmaDecodeAlways, xk::dev::kMmaDecodeAuto}) {
    xk::dev::set_kq_mma(mode);
    for (const uint32_t type : {xk::kQ2_K, xk::kQ3_K}) {
      CAPTURE(mode);
      CAPTURE(xk::type_name(type));
      const ExpertBatch eb(type, ne0, ne1, 3, counts, np, rng);
      const auto& hw = eb.hw;
      const auto& ws = eb.ws;
      const auto& probs = eb.probs;
      const auto& x = eb.x;
      const int rows = eb.rows;
      const DevBuf& dx = *eb.dx;
      const size_t m = size_t(rows * ne1);
      DevBuf dy(m * 4), dsep(m * 4);
      for (int ci = 0; ci < 3; ++ci) {
        xk::Context* ctx = ctxs[ci];
        CAPTURE(ci);
        dy.poison();
        REQUIRE(xk::grouped_matmul(ctx, type, ne0, ne1, probs.data(), np, dx.as<float>(), dy.as<float>(), rows,
                                   &dec, st.s) == xk::kOk);
        dsep.poison();
        for (const auto& p : probs)
          REQUIRE(xk::matmul(ctx, type, p.w, ne0, ne1, dx.as<float>() + p.row * ne0, p.n_tokens,
                             dsep.as<float>() + p.row * ne1, &dec, st.s) == xk::kOk);
        st.sync();
        const auto a = fetch(dy, m), b = fetch(dsep, m);
        CHECK(std::memcmp(a.data(), b.data(), m * 4) == 0);
        for (int i = 0; i < np; ++i) {
          const auto& p = probs[size_t(i)];
          const size_t at = size_t(p.row * ne1), len = size_t(p.n_tokens * ne1);
          if (std::memcmp(a.data() + at, b.data() + at, len * 4) != 0)
            MESSAGE("problem " << i << " of " << p.n_tokens << " tokens differs from its launch alone");
        }
        for (int i = 0; i < np; ++i) {
          const auto& p = probs[size_t(i)];
          const Ref ref = reference(type, hw[size_t(i % 3)], ne0, ne1, x.data() + p.row * ne0, p.n_tokens);
          std::vector<float> g(a.begin() + p.row * ne1, a.begin() + (p.row + p.n_tokens) * ne1);
          CHECK(count_bad(g, ref, kTolFp32, xk::type_name(type)) == 0);
        }
      }
      // Products of one input: 40, 17 and 40 rows, at 1, 3 and 8 tokens.
      const int64_t prow[] = {40, 17, 40};
      for (const int n : {1, 3, 8}) {
        CAPTURE(n);
        std::vector<std::unique_ptr<DevBuf>> ys, seps;
        std::vector<xk::SharedInputProduct> ps;
        for (int i = 0; i < 3; ++i) {
          ys.push_back(std::make_unique<DevBuf>(size_t(n * prow[i]) * 4));
          seps.push_back(std::make_unique<DevBuf>(size_t(n * prow[i]) * 4));
          ys.back()->poison();
          seps.back()->poison();
          ps.push_back({ws[size_t(i)]->p, prow[i], ys.back()->as<float>()});
        }
        REQUIRE(xk::shared_input_matmul(ctxs[0], type, ne0, ps.data(), 3, dx.as<float>(), n, &dec, st.s) ==
                xk::kOk);
        for (int i = 0; i < 3; ++i)
          REQUIRE(xk::matmul(ctxs[0], type, ws[size_t(i)]->p, ne0, prow[i], dx.as<float>(), n,
                             seps[size_t(i)]->as<float>(), &dec, st.s) == xk::kOk);
        st.sync();
        for (int i = 0; i < 3; ++i) {
          CAPTURE(i);
          const size_t mm = size_t(n * prow[i]);
          const auto a = fetch(*ys[size_t(i)], mm), b = fetch(*seps[size_t(i)], mm);
          CHECK(std::memcmp(a.data(), b.data(), mm * 4) == 0);
        }
        const Ref ref = reference(type, hw[1], ne0, prow[1], x.data(), n);
        CHECK(count_bad(fetch(*ys[1], size_t(n * prow[1])), ref, kTolFp32, xk::type_name(type)) == 0);
      }
    }
  }
  xk::dev::set_kq_mma(xk::dev::kMmaDecodeAuto);
  for (xk::Context* c : ctxs) xk::context_destroy(c);
}

// float_gemm against a host loop in double: every transpose combination, rows
// padded past their width, two batches with a gap between them, beta 0 (C is
// NaN before: not read) and beta 0.5 (added to C); nothing outside each C_b's
// m x n elements is written.
TEST_CASE("float_gemm: row-major strided batches equal a host loop") {
  std::mt19937 rng(21);
  Stream st;
  xk::Context* ctx = nullptr;
  REQUIRE(xk::context_create(&ctx, 0) == xk::kOk);
  const int64_t m = 5, n = 3, k = 7;
  const int batch = 2;
  const float alpha = 1.5f;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const float beta : {0.0f, 0.5f}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        // as stored: A is k x m with trans_a (else m x k), B n x k with trans_b (else k x n)
        const int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 3, ldc = n + 1;
        const int64_t sa = (ta ? k : m) * lda + 5, sb = (tb ? n : k) * ldb + 1, sc = m * ldc + 2;
        const auto A = random_x(size_t(sa * batch), rng), B = random_x(size_t(sb * batch), rng);
        auto C0 = random_x(size_t(sc * batch), rng);
        if (beta == 0.0f) std::memset(C0.data(), 0xFF, C0.size() * 4);
        DevBuf da(A.size() * 4), db(B.size() * 4), dc(C0.size() * 4);
        da.put(A.data(), A.size() * 4);
        db.put(B.data(), B.size() * 4);
        dc.put(C0.data(), C0.size() * 4);
        REQUIRE(xk::float_gemm(ctx, ta, tb, m, n, k, alpha, da.as<float>(), lda, sa, db.as<float>(), ldb, sb, beta,
                               dc.as<float>(), ldc, sc, batch, st.s) == xk::kOk);
        st.sync();
        const auto C = fetch(dc, C0.size());
        int bad = 0, touched = 0;
        for (int b = 0; b < batch; ++b)
          for (int64_t e = 0; e < sc; ++e) {
            const int64_t i = e / ldc, j = e % ldc;
            const size_t at = size_t(b * sc + e);
            if (i >= m || j >= n) {
              touched += std::memcmp(&C[at], &C0[at], 4) != 0;
              continue;
            }
            double sum = 0, mag = 0;
            for (int64_t l = 0; l < k; ++l) {
              const double av = A[size_t(b * sa + (ta ? l * lda + i : i * lda + l))];
              const double bv = B[size_t(b * sb + (tb ? j * ldb + l : l * ldb + j))];
              sum += av * bv;
              mag += std::fabs(av * bv);
            }
            const double c0 = beta == 0.0f ? 0.0 : double(C0[at]);
            const double want = alpha * sum + beta * c0;
            bad += !(std::fabs(double(C[at]) - want) <= kTolFp32 * (alpha * mag + std::fabs(beta * c0)));
          }
        CHECK(bad == 0);
        CHECK(touched == 0);
      }
  xk::context_destroy(ctx);
}

TEST_CASE("bad input is refused and writes nothing") {
  Stream st;
  DevBuf dw(1 << 20), dx(1 << 20), dy(1 << 16);
  check_cuda(cudaMemset(dw.p, 0, dw.n));
  check_cuda(cudaDeviceSynchronize());
  dy.poison();
  float* x = dx.as<float>();
  float* y = dy.as<float>();
  // Unsupported types (Q4_0, Q8_K, I32, an unknown id).
  for (uint32_t t : {2u, 15u, 26u, 99u}) {
    CHECK(xk::matvec(t, dw.p, 256, 4, x, 1, y, st.s) == xk::kErrType);
    CHECK(xk::dequantize_rows(t, dw.p, 256, 4, y, st.s) == xk::kErrType);
    CHECK(xk::row_bytes(t, 256) == 0);
  }
  // ne0 not a whole number of blocks, or empty shapes.
  CHECK(xk::matvec(xk::kQ4_K, dw.p, 300, 4, x, 1, y, st.s) == xk::kErrShape);
  CHECK(xk::matvec(xk::kMXFP4, dw.p, 48, 4, x, 1, y, st.s) == xk::kErrShape);
  CHECK(xk::matvec(xk::kQ8_0, dw.p, 0, 4, x, 1, y, st.s) == xk::kErrShape);
  CHECK(xk::matvec(xk::kQ8_0, dw.p, 64, 0, x, 1, y, st.s) == xk::kErrShape);
  CHECK(xk::dequantize_rows(xk::kQ2_K, dw.p, 100, 1, y, st.s) == xk::kErrShape);
  CHECK(xk::row_bytes(xk::kQ3_K, 255) == 0);
  // Token counts and pointers.
  CHECK(xk::matvec(xk::kQ8_0, dw.p, 64, 4, x, 0, y, st.s) == xk::kErrArgument);
  CHECK(xk::matvec(xk::kQ8_0, dw.p, 64, 4, x, 9, y, st.s) == xk::kErrArgument);
  CHECK(xk::matvec(xk::kQ8_0, nullptr, 64, 4, x, 1, y, st.s) == xk::kErrArgument);
  CHECK(xk::matvec(xk::kQ8_0, dw.p, 64, 4, nullptr, 1, y, st.s) == xk::kErrArgument);
  CHECK(xk::matvec(xk::kQ8_0, dw.as<uint8_t>() + 2, 64, 4, x, 1, y, st.s) == xk::kErrAlignment);
  CHECK(xk::matvec(xk::kQ8_0, dw.p, 64, 4, x + 1, 1, y, st.s) == xk::kErrAlignment);
  // Problem lists.
  std::vector<xk::ExpertProblem> probs(xk::kMaxGroupedProblems + 1, xk::ExpertProblem{dw.p, 0, 1});
  CHECK(xk::grouped_matvec(xk::kQ8_0, 64, 4, probs.data(), xk::kMaxGroupedProblems + 1, x, y, 1, st.s) == xk::kErrArgument);
  CHECK(xk::grouped_matvec(xk::kQ8_0, 64, 4, probs.data(), 0, x, y, 1, st.s) == xk::kErrArgument);
  xk::ExpertProblem past{dw.p, 3, 2};  // rows 3..4 of a 4-row input
  CHECK(xk::grouped_matvec(xk::kQ8_0, 64, 4, &past, 1, x, y, 4, st.s) == xk::kErrArgument);
  // matmul options and contexts.
  xk::Context* ctx = nullptr;
  CHECK(xk::context_create(nullptr, 0) == xk::kErrArgument);
  REQUIRE(xk::context_create(&ctx, 4096) == xk::kOk);
  xk::MatmulOptions o{};
  o.size = sizeof o;
  o.precision = 7;
  CHECK(xk::matmul(ctx, xk::kQ8_0, dw.p, 64, 4, x, 16, y, &o, st.s) == xk::kErrArgument);
  o.precision = 0;
  o.matvec_max_tokens = 9;
  CHECK(xk::matmul(ctx, xk::kQ8_0, dw.p, 64, 4, x, 16, y, &o, st.s) == xk::kErrArgument);
  o.matvec_max_tokens = 0;
  o.fp32_tiles = 2;
  CHECK(xk::matmul(ctx, xk::kQ8_0, dw.p, 64, 4, x, 16, y, &o, st.s) == xk::kErrArgument);
  o.fp32_tiles = 0;
  CHECK(xk::matmul(nullptr, xk::kQ8_0, dw.p, 64, 4, x, 16, y, nullptr, st.s) == xk::kErrArgument);
  // A 4096-byte workspace cannot hold one 2048-element fp32 row (Q4_K takes the
  // tile path) nor one row's split activations (12 KiB: the tensor-core types
  // then take the tile path too).
  CHECK(xk::matmul(ctx, xk::kQ4_K, dw.p, 2048, 4, x, 16, y, nullptr, st.s) == xk::kErrWorkspace);
  CHECK(xk::matmul(ctx, xk::kQ8_0, dw.p, 2048, 4, x, 16, y, nullptr, st.s) == xk::kErrWorkspace);
  // shared_input_matmul: its list, its products, its x.
  xk::SharedInputProduct ok[2] = {{dw.p, 4, y}, {dw.p, 8, y + 64}};
  CHECK(xk::shared_input_matmul(nullptr, xk::kQ8_0, 64, ok, 2, x, 1, nullptr, st.s) == xk::kErrArgument);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, nullptr, 2, x, 1, nullptr, st.s) == xk::kErrArgument);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, ok, 0, x, 1, nullptr, st.s) == xk::kErrArgument);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, ok, xk::kMaxSharedInputProducts + 1, x, 1, nullptr, st.s) ==
        xk::kErrArgument);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, ok, 2, nullptr, 1, nullptr, st.s) == xk::kErrArgument);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, ok, 2, x, 0, nullptr, st.s) == xk::kErrArgument);
  CHECK(xk::shared_input_matmul(ctx, 99u, 64, ok, 2, x, 1, nullptr, st.s) == xk::kErrType);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 48, ok, 2, x, 1, nullptr, st.s) == xk::kErrShape);
  xk::SharedInputProduct bad[2] = {ok[0], ok[1]};
  bad[1].ne1 = 0;
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, bad, 2, x, 1, nullptr, st.s) == xk::kErrShape);
  bad[1] = ok[1];
  bad[1].y = nullptr;
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, bad, 2, x, 1, nullptr, st.s) == xk::kErrArgument);
  bad[1] = ok[1];
  bad[1].w = dw.as<uint8_t>() + 2;
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, bad, 2, x, 1, nullptr, st.s) == xk::kErrAlignment);
  CHECK(xk::shared_input_matmul(ctx, xk::kQ8_0, 64, ok, 2, x + 1, 1, nullptr, st.s) == xk::kErrAlignment);
  // float_gemm (here y = x * x^T, 4 x 4 of width 8, with trans_b): pointers,
  // sizes, strides, leading dimensions; an empty product does nothing.
  const auto fgemm = [&](xk::Context* c, const float* a, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                         int64_t lda, int64_t ldb, int64_t ldc, int64_t stride, int batch) {
    return xk::float_gemm(c, false, true, m, n, k, 1.0f, a, lda, stride, b, ldb, stride, 0.0f, out, ldc, stride,
                          batch, st.s);
  };
  CHECK(fgemm(nullptr, x, x, y, 4, 4, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, nullptr, x, y, 4, 4, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, nullptr, y, 4, 4, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, nullptr, 4, 4, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, -1, 4, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 4, -1, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 4, 4, 0, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 4, 4, -8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, 8, 8, 4, 0, -1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, 8, 8, 4, -16, 2) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, 7, 8, 4, 0, 1) == xk::kErrArgument);   // lda < k
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, 8, 7, 4, 0, 1) == xk::kErrArgument);   // ldb < k (trans_b)
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, 8, 8, 3, 0, 1) == xk::kErrArgument);   // ldc < n
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, int64_t(1) << 31, 8, 4, 0, 1) == xk::kErrArgument);  // over int
  CHECK(fgemm(ctx, x, x, y, int64_t(1) << 31, 4, 8, 8, 8, 4, 0, 1) == xk::kErrArgument);
  CHECK(fgemm(ctx, x, x, y, 0, 4, 8, 8, 8, 4, 0, 1) == xk::kOk);
  CHECK(fgemm(ctx, x, x, y, 4, 4, 8, 8, 8, 4, 0, 0) == xk::kOk);
  xk::context_destroy(ctx);
  CHECK(xk::situ_mul(x, x, 4, 0.0f, 1.0f, y, st.s) == xk::kErrArgument);
  CHECK(xk::gather_rows(nullptr, 4, nullptr, 1, y, st.s) == xk::kErrArgument);
  st.sync();
  std::vector<uint32_t> out(dy.n / 4);
  dy.get(out.data(), dy.n);
  bool untouched = true;
  for (uint32_t v : out) untouched = untouched && v == 0xFFFFFFFFu;
  CHECK(untouched);
  CHECK(std::string(xk::status_name(xk::kErrShape)).find("block") != std::string::npos);
}

TEST_CASE("MoE pieces: gather, activations, weighted combine") {
  std::mt19937 rng(7);
  Stream st;
  const int64_t d = 300, n_tok = 5, k = 3, n = 1000;
  const auto src = random_x(size_t(n_tok * d), rng);
  const std::vector<int32_t> rows = {4, 0, 0, 2, 3, 1, 1};
  DevBuf dsrc(src.size() * 4), drows(rows.size() * 4), ddst(rows.size() * size_t(d) * 4);
  dsrc.put(src.data(), src.size() * 4);
  drows.put(rows.data(), rows.size() * 4);
  ddst.poison();
  REQUIRE(xk::gather_rows(dsrc.as<float>(), d, drows.as<int32_t>(), int64_t(rows.size()), ddst.as<float>(), st.s) == xk::kOk);
  st.sync();
  std::vector<float> g(rows.size() * size_t(d));
  ddst.get(g.data(), g.size() * 4);
  bool same = true;
  for (size_t r = 0; r < rows.size(); ++r)
    same = same && std::memcmp(&g[r * d], &src[size_t(rows[r]) * d], d * 4) == 0;
  CHECK(same);

  auto gate = random_x(n, rng), up = random_x(n, rng);
  for (auto& v : gate) v *= 12.0f;  // past the clamp limit
  for (auto& v : up) v *= 12.0f;
  DevBuf dg(n * 4), du(n * 4), dout(n * 4);
  dg.put(gate.data(), n * 4);
  du.put(up.data(), n * 4);
  auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-5 * std::fabs(b) + 1e-6; };
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  for (int kind = 0; kind < 3; ++kind) {
    CAPTURE(kind);
    dout.poison();
    int stt = kind == 0 ? xk::silu_mul(dg.as<float>(), du.as<float>(), n, dout.as<float>(), st.s)
            : kind == 1 ? xk::clamped_swiglu(dg.as<float>(), du.as<float>(), n, 7.0f, dout.as<float>(), st.s)
                        : xk::situ_mul(dg.as<float>(), du.as<float>(), n, 4.0f, 25.0f, dout.as<float>(), st.s);
    REQUIRE(stt == xk::kOk);
    st.sync();
    std::vector<float> o(n);
    dout.get(o.data(), n * 4);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      double gg = gate[size_t(i)], uu = up[size_t(i)], want;
      if (kind == 0) want = silu(gg) * uu;
      else if (kind == 1) want = silu(std::min(gg, 7.0)) * std::min(std::max(uu, -7.0), 7.0);
      else want = std::tanh(gg / 4.0) * 4.0 / (1.0 + std::exp(-gg)) * std::tanh(uu / 25.0) * 25.0;
      bad += !near(o[size_t(i)], want);
    }
    CHECK(bad == 0);
  }

  // combine: out[t] = sum_j w[t][j] * y[rows[t][j]] (a negative row is skipped).
  const std::vector<int32_t> crow = {0, 3, 6, 1, -1, 2, 5, 4, 0, 6, 6, 1, 2, 3, 4};
  const auto cw = random_x(crow.size(), rng);
  DevBuf dcr(crow.size() * 4), dcw(cw.size() * 4), dco(size_t(n_tok * d) * 4);
  dcr.put(crow.data(), crow.size() * 4);
  dcw.put(cw.data(), cw.size() * 4);
  for (bool accumulate : {false, true}) {
    dco.put(src.data(), src.size() * 4);
    REQUIRE(xk::combine_rows(ddst.as<float>(), d, dcr.as<int32_t>(), dcw.as<float>(), n_tok, int(k), accumulate,
                             dco.as<float>(), st.s) == xk::kOk);
    st.sync();
    std::vector<float> o(size_t(n_tok * d));
    dco.get(o.data(), o.size() * 4);
    int bad = 0;
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t c = 0; c < d; ++c) {
        double want = accumulate ? src[size_t(t * d + c)] : 0.0;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t r = crow[size_t(t * k + j)];
          if (r >= 0) want += double(cw[size_t(t * k + j)]) * g[size_t(r) * d + c];
        }
        bad += !near(o[size_t(t * d + c)], want);
      }
    CHECK(bad == 0);
  }
}

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIP: no CUDA device (%s): the kernel tests need a GPU\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
