// xpack-run's dequantizers (examples/xpack-run/dequant.cpp) against an
// independent reference, llama.cpp's gguf-py (test/runtime/dequant_ref.py), block
// by block and bit for bit: random blocks, every quantized tensor of the oracle
// models (written by llama-quantize), hand-computed blocks and bad input.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.h"
#include "ops.h"
#include "xpack/xpack.h"
#include "skip.h"

using xpack::test::read_file;
using xpack::test::run_command;
using xpack::test::TempDir;
using xpack::test::write_file;

namespace {

struct QType {
  const char* name;  // as gguf-py's GGMLQuantizationType spells it
  uint32_t id;
  uint32_t block_elems;
  uint32_t block_bytes;
  std::vector<uint32_t> f16_fields;  // byte offsets of f16 scale fields in a block
};

const std::vector<QType>& quant_types() {
  static const std::vector<QType> types = {
      {"Q8_0", XPACK_TYPE_Q8_0, 32, 34, {0}},
      {"Q2_K", XPACK_TYPE_Q2_K, 256, 84, {80, 82}},
      {"Q3_K", XPACK_TYPE_Q3_K, 256, 110, {108}},
      {"Q4_K", XPACK_TYPE_Q4_K, 256, 144, {0, 2}},
      {"Q5_K", XPACK_TYPE_Q5_K, 256, 176, {0, 2}},
      {"Q6_K", XPACK_TYPE_Q6_K, 256, 210, {208}},
      {"MXFP4", XPACK_TYPE_MXFP4, 32, 17, {}},
  };
  return types;
}

// A scale field as real files hold them: mostly ordinary magnitudes of either
// sign, with zero, negative zero, subnormals and the largest finite half mixed in.
// Never inf/NaN: no quantizer writes them and they say nothing about decoding.
uint16_t sane_f16(std::mt19937& rng) {
  const uint32_t kind = rng() % 16;
  const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
  const uint16_t mant = uint16_t(rng() & 0x3FF);
  switch (kind) {
    case 0: return sign;                                   // +-0
    case 1: return uint16_t(sign | (mant ? mant : 1));     // subnormal
    case 2: return uint16_t(sign | 0x7BFF);                // +-65504
    case 3: return uint16_t(sign | (1u << 10) | mant);     // smallest normals
    default: {
      const uint16_t exp = uint16_t(1 + rng() % 30);       // any finite normal
      return uint16_t(sign | (exp << 10) | mant);
    }
  }
}

std::vector<uint8_t> random_blocks(const QType& t, int n_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> data(size_t(n_blocks) * t.block_bytes);
  for (auto& b : data) b = uint8_t(rng());
  for (int b = 0; b < n_blocks; ++b) {
    uint8_t* blk = data.data() + size_t(b) * t.block_bytes;
    for (uint32_t off : t.f16_fields) {
      const uint16_t h = sane_f16(rng);
      blk[off] = uint8_t(h);
      blk[off + 1] = uint8_t(h >> 8);
    }
  }
  if (t.id == XPACK_TYPE_MXFP4) {
    // Every E8M0 exponent once (0, 1: subnormal scales; 254; 255: 2^127, not NaN),
    // then random ones.
    for (int b = 0; b < n_blocks && b < 256; ++b) data[size_t(b) * t.block_bytes] = uint8_t(b);
  }
  return data;
}

std::string script_path() {
  return (xpack::test::data_dir() / ".." / "runtime" / "dequant_ref.py").string();
}

// Decodes `data` with gguf-py; empty on failure (with a doctest failure logged).
std::vector<float> reference_decode(const char* type_name, const std::vector<uint8_t>& data) {
  TempDir dir;
  write_file(dir / "in.bin", data);
  std::string out;
  const std::string cmd = "python3 '" + script_path() + "' " + type_name + " '" +
                          (dir / "in.bin").string() + "' '" + (dir / "out.f32").string() + "'";
  const int rc = run_command(cmd, &out);
  if (rc != 0) {
    FAIL_CHECK("reference decoder failed (rc " << rc << "): " << cmd << "\n" << out);
    return {};
  }
  const std::vector<uint8_t> bytes = read_file(dir / "out.f32");
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), f.size() * 4);
  return f;
}

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Bit-exact comparison; reports the first few differing elements with their block.
void expect_bit_identical(const std::string& what, const std::vector<float>& got,
                          const std::vector<float>& want, uint32_t block_elems) {
  REQUIRE(got.size() == want.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) == bits_of(want[i])) continue;
    if (++mismatches <= 5)
      FAIL_CHECK(what << ": element " << i << " (block " << i / block_elems << ", index "
                      << i % block_elems << "): got " << got[i] << " (0x" << std::hex
                      << bits_of(got[i]) << "), reference " << want[i] << " (0x"
                      << bits_of(want[i]) << std::dec << ")");
  }
  CHECK_MESSAGE(mismatches == 0, what << ": " << mismatches << " of " << got.size()
                                      << " elements differ from gguf-py");
}

std::vector<float> decode(uint32_t type, const std::vector<uint8_t>& data, int64_t n) {
  std::vector<float> out(size_t(n), std::numeric_limits<float>::quiet_NaN());
  xrun::dequantize(type, data.data(), out.data(), n);
  return out;
}

void put_f16(std::vector<uint8_t>& b, size_t off, uint16_t h) {
  b[off] = uint8_t(h);
  b[off + 1] = uint8_t(h >> 8);
}

}  // namespace

TEST_CASE("dequantize: quantized blocks match gguf-py bit for bit") {
  XPACK_REQUIRE_PYTHON_GGUF();
  uint32_t seed = 1234;
  for (const QType& t : quant_types()) {
    SUBCASE(t.name) {
      const int n_blocks = t.id == XPACK_TYPE_MXFP4 ? 1024 : 512;
      const auto data = random_blocks(t, n_blocks, seed);
      CHECK(xrun::row_bytes(t.id, int64_t(n_blocks) * t.block_elems) == data.size());
      const auto got = decode(t.id, data, int64_t(n_blocks) * t.block_elems);
      const auto want = reference_decode(t.name, data);
      expect_bit_identical(t.name, got, want, t.block_elems);
    }
    ++seed;
  }
}

TEST_CASE("dequantize: F32, F16 and BF16 match gguf-py for every 16-bit pattern") {
  XPACK_REQUIRE_PYTHON_GGUF();
  std::vector<uint8_t> all16(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) put_f16(all16, 2 * h, uint16_t(h));

  SUBCASE("BF16") {
    expect_bit_identical("BF16", decode(XPACK_TYPE_BF16, all16, 65536),
                         reference_decode("BF16", all16), 1);
  }
  SUBCASE("F16") {
    // NaN halves are left out: their payload after widening depends on whether the
    // converter is software or F16C hardware (which quiets signalling NaNs), and
    // no model stores NaN weights. Every other pattern, subnormals included, is exact.
    std::vector<uint8_t> finite;
    for (uint32_t h = 0; h < 65536; ++h)
      if ((h & 0x7C00) != 0x7C00 || (h & 0x3FF) == 0) {
        finite.push_back(uint8_t(h));
        finite.push_back(uint8_t(h >> 8));
      }
    const auto got = decode(XPACK_TYPE_F16, finite, int64_t(finite.size() / 2));
    expect_bit_identical("F16", got, reference_decode("F16", finite), 1);
    // And NaN stays NaN with its sign.
    std::vector<uint8_t> nan = {0x01, 0x7C, 0x00, 0xFE};
    const auto n = decode(XPACK_TYPE_F16, nan, 2);
    CHECK(std::isnan(n[0]));
    CHECK(std::isnan(n[1]));
    CHECK(std::signbit(n[1]));
  }
  SUBCASE("F32") {
    std::mt19937 rng(7);
    std::vector<uint8_t> f32(4096 * 4);
    for (auto& b : f32) b = uint8_t(rng());
    expect_bit_identical("F32", decode(XPACK_TYPE_F32, f32, 4096), reference_decode("F32", f32), 1);
  }
}

// Real blocks as llama-quantize wrote them: every quantized tensor of the oracle
// models (Q8_0, Q2_K, Q3_K, MXFP4), decoded by us and by gguf-py.
TEST_CASE("dequantize: every quantized tensor of the oracle models matches gguf-py") {
  const auto sd = xpack::test::shared_dir();
  if (!sd) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared (oracle models) is absent");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  for (const std::string model : {"deepseek4-mxfp4.gguf", "kimi-k3-q2k-q3k.gguf"}) {
    CAPTURE(model);
    const auto found = xpack::test::fixture_file(*sd / "oracle" / "models", model);
    if (!found) continue;
    const std::filesystem::path path = *found;
    TempDir dir;
    std::string listing;
    const std::string cmd = "python3 '" + script_path() + "' --gguf '" + path.string() + "' '" +
                            (dir / "ref.f32").string() + "'";
    REQUIRE_MESSAGE(run_command(cmd, &listing) == 0, cmd << "\n" << listing);
    const std::vector<uint8_t> ref_bytes = read_file(dir / "ref.f32");

    xpack_gguf* g = nullptr;
    REQUIRE_MESSAGE(xpack_gguf_open(path.c_str(), nullptr, &g) == 0, xpack_last_error());
    std::istringstream lines(listing);
    size_t offset = 0, tensors = 0;
    for (std::string line; std::getline(lines, line);) {
      const size_t t1 = line.find('\t'), t2 = line.rfind('\t');
      if (t1 == std::string::npos || t1 == t2) continue;
      const std::string name = line.substr(0, t1);
      const int64_t n = std::stoll(line.substr(t2 + 1));
      const int64_t idx = xpack_gguf_find_tensor(g, name.c_str());
      REQUIRE_MESSAGE(idx >= 0, name);
      xpack_tensor_info info{};
      info.size = sizeof info;
      REQUIRE(xpack_gguf_tensor_info(g, idx, &info) == 0);
      const void* data = nullptr;
      REQUIRE(xpack_gguf_tensor_data(g, idx, &data) == 0);
      REQUIRE(offset + size_t(n) * 4 <= ref_bytes.size());
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      std::memcpy(want.data(), ref_bytes.data() + offset, size_t(n) * 4);
      offset += size_t(n) * 4;
      xrun::dequantize(info.type, data, got.data(), n);
      uint32_t block_elems = 1;
      xpack_type_info(info.type, nullptr, &block_elems, nullptr);
      expect_bit_identical(model + " " + name + " (" + line.substr(t1 + 1, t2 - t1 - 1) + ")",
                           got, want, block_elems);
      ++tensors;
    }
    xpack_gguf_close(g);
    CHECK(offset == ref_bytes.size());
    CHECK(tensors > 10);
    MESSAGE(model << ": " << tensors << " quantized tensors compared");
  }
}

TEST_CASE("dequantize: hand-computed Q2_K block") {
  std::vector<uint8_t> b(84, 0);
  uint8_t* scales = b.data();
  uint8_t* qs = b.data() + 16;
  put_f16(b, 80, 0x3C00);  // d = 1
  put_f16(b, 82, 0x3800);  // dmin = 0.5
  scales[0] = 0x23;        // sub-block 0: scale 3, min 2
  scales[1] = 0x32;        // sub-block 1: scale 2, min 3
  scales[2] = 0x51;        // sub-block 2: scale 1, min 5
  scales[4] = 0x0F;        // sub-block 4: scale 15, min 0
  scales[6] = 0xA4;        // sub-block 6: scale 4, min 10
  scales[8] = 0x16;        // sub-block 8: scale 6, min 1
  qs[0] = 0xE4;            // quants 0,1,2,3 for elements 0, 32, 64, 96
  qs[17] = 0x03;           // element 17: quant 3
  qs[32] = 0x02;           // element 128: quant 2
  const auto y = decode(XPACK_TYPE_Q2_K, b, 256);
  CHECK(y[0] == -1.0f);     // 3*0 - 0.5*2
  CHECK(y[1] == -1.0f);     // same sub-block, quant 0
  CHECK(y[17] == 4.5f);     // 2*3 - 0.5*3
  CHECK(y[32] == -1.5f);    // 1*1 - 0.5*5
  CHECK(y[64] == 30.0f);    // 15*2 - 0
  CHECK(y[96] == 7.0f);     // 4*3 - 0.5*10
  CHECK(y[128] == 11.5f);   // 6*2 - 0.5*1
  CHECK(y[255] == -0.0f);   // sub-block 15: scale 0, min 0
}

TEST_CASE("dequantize: hand-computed Q3_K block") {
  std::vector<uint8_t> b(110, 0);
  uint8_t* hmask = b.data();
  uint8_t* qs = b.data() + 32;
  uint8_t* scales = b.data() + 96;
  put_f16(b, 108, 0x4000);  // d = 2
  scales[0] = 0x75;         // low nibbles: sub-block 0 -> 5, sub-block 8 -> 7
  scales[8] = 0xC2;         // high bits: sub-block 0 -> 2, 4 -> 0, 8 -> 0, 12 -> 3
  hmask[0] = 0x11;          // high bit set for element 0 (bit 0) and element 128 (bit 4)
  qs[0] = 0xE7;             // low bits 3,1,2,3 for elements 0, 32, 64, 96
  qs[32] = 0x01;            // low bits 1,0,0,0 for elements 128, 160, 192, 224
  const auto y = decode(XPACK_TYPE_Q3_K, b, 256);
  CHECK(y[0] == 30.0f);     // scale 5+32-32=5, q = 3      -> 2*5*3
  CHECK(y[32] == 192.0f);   // scale -32,       q = 1-4    -> 2*-32*-3
  CHECK(y[64] == 128.0f);   // scale -32,       q = 2-4    -> 2*-32*-2
  CHECK(y[128] == -50.0f);  // scale 7-32=-25,  q = 1      -> 2*-25*1
  CHECK(y[192] == -128.0f); // scale 48-32=16,  q = 0-4    -> 2*16*-4
  CHECK(y[1] == 2.0f * 5 * -4);  // sub-block 0, no high bit, low 0
}

TEST_CASE("dequantize: hand-computed MXFP4 blocks, including extreme exponents") {
  std::vector<uint8_t> b(17 * 4, 0);
  b[0] = 127;      // scale 2^-1
  b[1] = 0x97;     // element 0: code 7 (+12), element 16: code 9 (-1)
  b[2] = 0x8F;     // element 1: code 15 (-12), element 17: code 8 (-0)
  b[17] = 0;       // scale 2^-128: an f32 subnormal, must not flush to zero
  b[18] = 0x71;    // element 0: code 1, element 16: code 7
  b[34] = 255;     // scale 2^127, not NaN
  b[35] = 0x71;
  b[51] = 1;       // scale 2^-127
  b[52] = 0x0A;    // element 0: code 10 (-2)
  const auto y = decode(XPACK_TYPE_MXFP4, b, 128);
  CHECK(y[0] == 6.0f);
  CHECK(y[16] == -0.5f);
  CHECK(y[1] == -6.0f);
  CHECK(bits_of(y[17]) == 0u);  // -0 code decodes to +0
  CHECK(y[2] == 0.0f);
  CHECK(bits_of(y[32]) == 0x00200000u);              // 2^-128
  CHECK(y[48] == std::ldexp(12.0f, -128));
  CHECK(y[64] == std::ldexp(1.0f, 127));
  CHECK(std::isinf(y[80]));                          // 12 * 2^127 overflows, as in ggml
  CHECK(bits_of(y[96]) == (0x80000000u | 0x00800000u));  // -2 * 2^-127 = -2^-126
}

TEST_CASE("dequantize: I32 converts to float") {
  std::vector<uint8_t> b(12);
  const int32_t v[3] = {-7, 0, 123456};
  std::memcpy(b.data(), v, sizeof v);
  const auto y = decode(XPACK_TYPE_I32, b, 3);
  CHECK(y[0] == -7.0f);
  CHECK(y[1] == 0.0f);
  CHECK(y[2] == 123456.0f);
}

TEST_CASE("row_bytes: sizes of the target models' expert rows") {
  CHECK(xrun::row_bytes(XPACK_TYPE_MXFP4, 4096) == 4096 / 32 * 17);
  CHECK(xrun::row_bytes(XPACK_TYPE_MXFP4, 4096) * 2048 == 4456448u);
  CHECK(xrun::row_bytes(XPACK_TYPE_Q2_K, 3584) * 3072 == 3612672u);
  CHECK(xrun::row_bytes(XPACK_TYPE_Q3_K, 3072) * 3584 == 4730880u);
  CHECK(xrun::row_bytes(XPACK_TYPE_Q5_K, 512) == 2 * 176u);
  CHECK(xrun::row_bytes(XPACK_TYPE_F16, 172) == 344u);
  CHECK(xrun::row_bytes(XPACK_TYPE_BF16, 3) == 6u);
  CHECK(xrun::row_bytes(XPACK_TYPE_F32, 0) == 0u);
}

TEST_CASE("dequantize and row_bytes reject bad input") {
  std::vector<uint8_t> b(256, 0);
  std::vector<float> y(512);
  // Rows that are not whole blocks (misaligned), negative sizes, unknown types.
  CHECK_THROWS_AS(xrun::row_bytes(XPACK_TYPE_Q2_K, 100), xrun::ModelError);
  CHECK_THROWS_AS(xrun::row_bytes(XPACK_TYPE_Q8_0, 31), xrun::ModelError);
  CHECK_THROWS_AS(xrun::row_bytes(XPACK_TYPE_F32, -4), xrun::ModelError);
  CHECK_THROWS_AS(xrun::row_bytes(99, 256), xrun::ModelError);
  CHECK_THROWS_AS(xrun::row_bytes(XPACK_TYPE_Q4_0, 32), xrun::ModelError);  // known id, no decoder
  CHECK_THROWS_AS(xrun::dequantize(XPACK_TYPE_MXFP4, b.data(), y.data(), 33), xrun::ModelError);
  CHECK_THROWS_AS(xrun::dequantize(XPACK_TYPE_Q6_K, b.data(), y.data(), -256), xrun::ModelError);
  CHECK_THROWS_AS(xrun::dequantize(40, b.data(), y.data(), 32), xrun::ModelError);
  CHECK_THROWS_WITH_AS(xrun::dequantize(XPACK_TYPE_Q8_1, b.data(), y.data(), 32),
                       doctest::Contains("unsupported ggml type 9"), xrun::ModelError);
  // Zero elements is a valid, empty request.
  CHECK_NOTHROW(xrun::dequantize(XPACK_TYPE_Q3_K, b.data(), y.data(), 0));
}
