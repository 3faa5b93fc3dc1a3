// The Expert Pack header + index: encode/decode round trip and every way open must
// fail closed on damaged or hostile bytes (no file system, no tools).
#include <doctest/doctest.h>

#include <cstring>

#include "common/checked_math.h"
#include "gguf/ggml_type.h"
#include "pack/format.h"
#include "pack/identity.h"
#include "pack/plan.h"
#include "pack_test_util.h"

using namespace xpack;
using namespace xpack::pack;
using xpack::test::rd64;
using xpack::test::reseal;
using xpack::test::wr32;
using xpack::test::wr64;

namespace {

// A memory "file" that also records the largest single read, so tests can prove a
// hostile header never makes the decoder read (and allocate) much.
class MemSource : public IndexSource {
 public:
  explicit MemSource(const std::vector<uint8_t>& b) : b_(b) {}
  Status read(uint64_t off, void* dst, size_t n) override {
    largest = std::max<uint64_t>(largest, n);
    if (off > b_.size() || n > b_.size() - off) return err(XPACK_E_TRUNCATED, "read past end");
    std::memcpy(dst, b_.data() + off, n);
    return {};
  }
  uint64_t largest = 0;

 private:
  const std::vector<uint8_t>& b_;
};

Role make_role(const char* name, uint32_t type, uint64_t ne0, uint64_t ne1, uint32_t n_experts) {
  Role r;
  r.name = name;
  r.type = type;
  r.n_dims = 2;
  r.ne = {ne0, ne1, 1};
  r.nbytes = gguf::tensor_nbytes(type, r.ne.data(), 2, name).value();
  r.source_n_dims = 3;
  r.source_ne = {ne0, ne1, n_experts, 1};
  r.source_pattern = std::string("blk.{block}.ffn_") + name + "_exps.weight";
  return r;
}

// A Kimi-like index: gate/up Q2_K, down Q3_K, two MoE layers (blocks 1 and 3).
Index sample_index() {
  Index idx;
  idx.arch = "kimi-k3";
  idx.n_experts = 4;
  idx.n_experts_used = 2;
  idx.layer_blocks = {1, 3};
  idx.roles = {make_role("gate", 10, 256, 32, 4), make_role("up", 10, 256, 32, 4), make_role("down", 11, 256, 32, 4)};
  idx.object_bytes = place_roles(idx.roles);
  idx.object_stride = align_up(idx.object_bytes, kAlignment);
  ShardIdentity s;
  s.metadata_sha256 = sha256_bytes("meta", 4);
  s.metadata_bytes = 1000;
  s.file_size = 5000;
  s.tensor_count = 12;
  idx.shards = {s};
  idx.source_identity = combine_identity(idx.shards);
  auto l = index_layout(idx.n_layers(), idx.n_experts, idx.n_roles(), 1).value();
  idx.data_start = l.data_start;
  idx.file_size = idx.data_start + idx.n_objects() * idx.object_stride;
  for (uint64_t i = 0; i < idx.n_objects() * (1 + idx.roles.size()); ++i) idx.checksums.push_back(i * 0x9E3779B97F4A7C15ull);
  return idx;
}

// The encoded index followed by zero "objects": a whole valid pack file in memory.
std::vector<uint8_t> sample_file(const Index& idx) {
  std::vector<uint8_t> b = encode_index(idx).value();
  b.resize(idx.file_size, 0);
  return b;
}

Result<Index> decode(const std::vector<uint8_t>& b, uint64_t* largest = nullptr) {
  MemSource src(b);
  auto r = decode_index(src, b.size(), "test.xpack");
  if (largest) *largest = src.largest;
  return r;
}

int code_of(const Result<Index>& r) { return r.ok() ? 0 : r.error().code; }

}  // namespace

TEST_CASE("roles with different types get aligned offsets, stride is a multiple of 4096") {
  Index idx = sample_index();
  CHECK(idx.roles[0].offset == 0);
  CHECK(idx.roles[1].offset % kRoleAlignment == 0);
  CHECK(idx.roles[1].offset >= idx.roles[0].nbytes);
  CHECK(idx.roles[2].offset >= idx.roles[1].offset + idx.roles[1].nbytes);
  CHECK(idx.object_bytes == idx.roles[2].offset + idx.roles[2].nbytes);
  CHECK(idx.object_stride % 4096 == 0);
  CHECK(idx.roles[0].nbytes == 256 * 32 / 256 * 84);
  CHECK(idx.roles[2].nbytes == 256 * 32 / 256 * 110);
}

TEST_CASE("encode/decode round trip keeps every field") {
  Index idx = sample_index();
  auto b = sample_file(idx);
  CHECK(b.size() == idx.file_size);
  CHECK(idx.data_start % 4096 == 0);
  auto r = decode(b);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  const Index& d = *r;
  CHECK(d.arch == "kimi-k3");
  CHECK(d.n_experts == 4);
  CHECK(d.n_experts_used == 2);
  CHECK(d.layer_blocks == idx.layer_blocks);
  CHECK(d.data_start == idx.data_start);
  CHECK(d.object_stride == idx.object_stride);
  CHECK(d.object_bytes == idx.object_bytes);
  CHECK(d.checksums == idx.checksums);
  CHECK(d.source_identity == idx.source_identity);
  REQUIRE(d.roles.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(d.roles[i].name == idx.roles[i].name);
    CHECK(d.roles[i].type == idx.roles[i].type);
    CHECK(d.roles[i].offset == idx.roles[i].offset);
    CHECK(d.roles[i].nbytes == idx.roles[i].nbytes);
    CHECK(d.roles[i].ne == idx.roles[i].ne);
    CHECK(d.roles[i].source_ne == idx.roles[i].source_ne);
    CHECK(d.roles[i].source_pattern == idx.roles[i].source_pattern);
  }
  CHECK(d.roles[2].source_name(3) == "blk.3.ffn_down_exps.weight");
  REQUIRE(d.shards.size() == 1);
  CHECK(d.shards[0].metadata_bytes == 1000);
}

TEST_CASE("any single damaged byte before data_start is caught") {
  Index idx = sample_index();
  const auto good = sample_file(idx);
  for (size_t i = 0; i < idx.data_start; ++i) {
    auto b = good;
    b[i] ^= 0x20;
    int code = code_of(decode(b));
    if (i < 8) {
      CHECK_MESSAGE(code == XPACK_E_BAD_MAGIC, "byte ", i);
    } else if (i < 12) {
      CHECK_MESSAGE(code == XPACK_E_VERSION, "byte ", i);
    } else {
      CHECK_MESSAGE(code == XPACK_E_CHECKSUM, "byte ", i);
    }
  }
}

TEST_CASE("wrong magic, wrong version, short files") {
  Index idx = sample_index();
  auto b = sample_file(idx);
  auto bad = b;
  std::memcpy(bad.data(), "GGUF\3\0\0\0", 8);
  CHECK(code_of(decode(bad)) == XPACK_E_BAD_MAGIC);
  bad = b;
  wr32(bad, 8, 2);
  reseal(bad);
  CHECK(code_of(decode(bad)) == XPACK_E_VERSION);
  CHECK(code_of(decode(std::vector<uint8_t>(b.begin(), b.begin() + 4))) == XPACK_E_TRUNCATED);
  CHECK(code_of(decode(std::vector<uint8_t>(b.begin(), b.begin() + 200))) == XPACK_E_TRUNCATED);
  CHECK(code_of(decode(std::vector<uint8_t>(b.begin(), b.begin() + 2000))) == XPACK_E_TRUNCATED);
  CHECK(code_of(decode(std::vector<uint8_t>())) == XPACK_E_TRUNCATED);
}

TEST_CASE("file size must be exactly data_start + objects x stride") {
  Index idx = sample_index();
  auto b = sample_file(idx);
  auto shorter = std::vector<uint8_t>(b.begin(), b.end() - 1);
  CHECK(code_of(decode(shorter)) == XPACK_E_SIZE_MISMATCH);
  auto minus_object = std::vector<uint8_t>(b.begin(), b.end() - idx.object_stride);
  CHECK(code_of(decode(minus_object)) == XPACK_E_SIZE_MISMATCH);
  auto longer = b;
  longer.push_back(0);
  CHECK(code_of(decode(longer)) == XPACK_E_SIZE_MISMATCH);
}

TEST_CASE("misaligned stride / data_start / alignment in a resealed header") {
  Index idx = sample_index();
  const auto good = sample_file(idx);
  SUBCASE("stride not a multiple of 4096") {
    auto b = good;
    wr64(b, 32, idx.object_stride + 512);
    wr64(b, 16, idx.data_start + idx.n_objects() * (idx.object_stride + 512));
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_MISALIGNED);
  }
  SUBCASE("data_start not a multiple of 4096") {
    auto b = good;
    wr64(b, 24, idx.data_start + 8);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_MISALIGNED);
  }
  SUBCASE("alignment field other than 4096") {
    auto b = good;
    wr32(b, 48, 512);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_MISALIGNED);
  }
  SUBCASE("role offset not 64-aligned") {
    auto b = good;
    uint64_t role1 = rd64(b, 96) + 256;
    wr64(b, role1 + 48, idx.roles[1].offset + 4);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_MISALIGNED);
  }
}

TEST_CASE("hostile counts fail with LIMIT/FORMAT before any large read") {
  Index idx = sample_index();
  const auto good = sample_file(idx);
  struct Case {
    size_t off;
    uint32_t value;
    int code;
  } cases[] = {
      {52, 0xFFFFFFFFu, XPACK_E_LIMIT},   // n_layers
      {56, 0xFFFFFFFFu, XPACK_E_LIMIT},   // n_experts
      {64, 1000, XPACK_E_LIMIT},          // n_roles
      {68, 0x7FFFFFFFu, XPACK_E_LIMIT},   // n_shards
      {52, 0, XPACK_E_FORMAT},            // no layers
      {64, 0, XPACK_E_FORMAT},            // no roles
      {60, 100, XPACK_E_FORMAT},          // top-k > experts
  };
  for (const Case& c : cases) {
    auto b = good;
    wr32(b, c.off, c.value);
    reseal(b);
    uint64_t largest = 0;
    int code = code_of(decode(b, &largest));
    CHECK_MESSAGE(code == c.code, "field @", c.off, " = ", c.value);
    CHECK(largest <= 256);
  }
  SUBCASE("4096 layers x 65536 experts is beyond the object limit") {
    auto b = good;
    wr32(b, 52, 4096);
    wr32(b, 56, 65536);
    reseal(b);
    uint64_t largest = 0;
    CHECK(code_of(decode(b, &largest)) == XPACK_E_LIMIT);
    CHECK(largest <= 256);
  }
  SUBCASE("counts that imply an index longer than the file") {
    auto b = good;
    wr32(b, 56, 4000);  // 2 layers x 4000 experts: index of ~256 KB, file is small
    reseal(b);
    uint64_t largest = 0;
    int code = code_of(decode(b, &largest));
    CHECK((code == XPACK_E_FORMAT || code == XPACK_E_TRUNCATED));
    CHECK(largest <= 256);
  }
}

TEST_CASE("bad role entries are refused") {
  Index idx = sample_index();
  const auto good = sample_file(idx);
  const uint64_t roles = rd64(good, 96);
  SUBCASE("unknown type") {
    auto b = good;
    wr32(b, roles + 16, 77);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_UNKNOWN_TYPE);
  }
  SUBCASE("nbytes disagrees with shape") {
    auto b = good;
    wr64(b, roles + 56, idx.roles[0].nbytes + 64);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_FORMAT);
  }
  SUBCASE("overlapping roles") {
    auto b = good;
    wr64(b, roles + 256 + 48, 0);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_OVERLAP);
  }
  SUBCASE("role name not NUL-terminated") {
    auto b = good;
    std::memset(b.data() + roles, 'a', 16);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_FORMAT);
  }
  SUBCASE("duplicate role names") {
    auto b = good;
    std::memcpy(b.data() + roles + 256, "gate\0", 5);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_DUPLICATE);
  }
  SUBCASE("layer table not increasing") {
    auto b = good;
    wr32(b, 256 + 4, 1);
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_FORMAT);
  }
  SUBCASE("identity digest disagrees with the shard table") {
    auto b = good;
    b[rd64(b, 104) + 3] ^= 1;
    reseal(b);
    CHECK(code_of(decode(b)) == XPACK_E_FORMAT);
  }
}

TEST_CASE("expert tensor names") {
  auto n = parse_expert_tensor_name("blk.12.ffn_gate_up_exps.weight");
  REQUIRE(n);
  CHECK(n->block == 12);
  CHECK(n->role == "gate_up");
  n = parse_expert_tensor_name("blk.0.ffn_down_exps.weight");
  REQUIRE(n);
  CHECK(n->role == "down");
  CHECK_FALSE(parse_expert_tensor_name("blk.1.ffn_down_shexp.weight"));
  CHECK_FALSE(parse_expert_tensor_name("blk.1.ffn_gate_inp.weight"));
  CHECK_FALSE(parse_expert_tensor_name("blk.x.ffn_up_exps.weight"));
  CHECK_FALSE(parse_expert_tensor_name("blk.01.ffn_up_exps.weight"));
  CHECK_FALSE(parse_expert_tensor_name("blk..ffn_up_exps.weight"));
  CHECK_FALSE(parse_expert_tensor_name("blk.1.ffn_up_exps.bias"));
  CHECK_FALSE(parse_expert_tensor_name("blk.99999999999.ffn_up_exps.weight"));
}

TEST_CASE("identity digest depends on every shard field") {
  ShardIdentity a;
  a.metadata_sha256 = sha256_bytes("x", 1);
  a.metadata_bytes = 10;
  a.file_size = 20;
  a.tensor_count = 3;
  auto base = combine_identity({a});
  auto b = a;
  b.file_size = 21;
  CHECK(combine_identity({b}) != base);
  b = a;
  b.tensor_count = 4;
  CHECK(combine_identity({b}) != base);
  CHECK(combine_identity({a, a}) != base);
  CHECK(to_hex(sha256_bytes("abc", 3)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("xxh3 (SIMD-dispatched where the library allows) equals xxHash's portable XXH3 at every length class") {
  // Every existing pack's checksums came from XXH3_64bits: a faster variant must
  // give the same 64 bits for short inputs, each of XXH3's size classes, long
  // unaligned ones and an expert-sized object.
  std::vector<uint8_t> buf(size_t(13369344) + 64);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& b : buf) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    b = uint8_t(s);
  }
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(8), size_t(9), size_t(16), size_t(17),
                   size_t(128), size_t(129), size_t(240), size_t(241), size_t(1024), size_t(4103),
                   size_t(1) << 20, size_t(13369344)}) {
    for (size_t off : {size_t(0), size_t(1), size_t(7), size_t(32)}) {
      CAPTURE(n);
      CAPTURE(off);
      CHECK(xxh3(buf.data() + off, n) == XXH3_64bits(buf.data() + off, n));
    }
  }
}
