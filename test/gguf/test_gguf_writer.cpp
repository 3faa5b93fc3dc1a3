// Writer: layout rules, value round trip through the reader, refusal of bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "fixtures.h"
#include "gguf/gguf_model.h"
#include "gguf_test_util.h"

using namespace xpack;
using namespace xpack::gguf;
using xpack::test::parse_bytes;
using xpack::test::pattern_bytes;
using xpack::test::same_value;

namespace {

std::vector<KeyValue> every_value_type() {
  using namespace val;
  std::vector<KeyValue> kvs;
  kvs.push_back({"t.u8", u8(255)});
  kvs.push_back({"t.i8", i8(-128)});
  kvs.push_back({"t.u16", u16(65535)});
  kvs.push_back({"t.i16", i16(-32768)});
  kvs.push_back({"t.u32", u32(0xFFFFFFFFu)});
  kvs.push_back({"t.i32", i32(std::numeric_limits<int32_t>::min())});
  kvs.push_back({"t.u64", u64(std::numeric_limits<uint64_t>::max())});
  kvs.push_back({"t.i64", i64(std::numeric_limits<int64_t>::min())});
  kvs.push_back({"t.f32", f32(-1.5e-38f)});
  kvs.push_back({"t.f32_nan", f32(std::numeric_limits<float>::quiet_NaN())});
  kvs.push_back({"t.f32_inf", f32(-std::numeric_limits<float>::infinity())});
  kvs.push_back({"t.f64", f64(3.141592653589793)});
  kvs.push_back({"t.f64_denorm", f64(std::numeric_limits<double>::denorm_min())});
  kvs.push_back({"t.f64_negzero", f64(-0.0)});
  kvs.push_back({"t.bool_true", boolean(true)});
  kvs.push_back({"t.bool_false", boolean(false)});
  kvs.push_back({"t.str", str("héllo\n\t\"world\"")});
  kvs.push_back({"t.str_empty", str("")});
  kvs.push_back({"t.str_nul", str(std::string("a\0b", 3))});
  kvs.push_back({"t.arr_empty", array(ValueType::U8, {})});
  kvs.push_back({"t.arr_i8", array(ValueType::I8, {i8(-1), i8(0), i8(127)})});
  kvs.push_back({"t.arr_u16", array(ValueType::U16, {u16(1), u16(65535)})});
  kvs.push_back({"t.arr_i16", array(ValueType::I16, {i16(-2)})});
  kvs.push_back({"t.arr_u32", u32_array({1, 2, 3})});
  kvs.push_back({"t.arr_i32", i32_array({-1, 0, 1})});
  kvs.push_back({"t.arr_u64", array(ValueType::U64, {u64(1ull << 63)})});
  kvs.push_back({"t.arr_i64", array(ValueType::I64, {i64(-5)})});
  kvs.push_back({"t.arr_f32", f32_array({0.5f, -2.0f})});
  kvs.push_back({"t.arr_f64", array(ValueType::F64, {f64(1e300)})});
  kvs.push_back({"t.arr_bool", array(ValueType::BOOL, {boolean(true), boolean(false)})});
  kvs.push_back({"t.arr_str", str_array({"x", "", "yz"})});
  // Nested: array of arrays (of different element types), three levels deep.
  kvs.push_back({"t.nested", array(ValueType::ARRAY,
                                   {u32_array({7, 8}), array(ValueType::STRING, {str("s")}),
                                    array(ValueType::ARRAY, {i32_array({-9})}),
                                    array(ValueType::F32, {})})});
  return kvs;
}

}  // namespace

TEST_CASE("writer: every value type and nested arrays round-trip through the reader") {
  Writer w;
  auto kvs = every_value_type();
  for (const auto& kv : kvs) w.add_kv(kv);
  auto bytes = gguf_bytes(w, {});
  REQUIRE(bytes.ok());
  auto f = parse_bytes(*bytes);
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  CHECK(f->version() == 3);
  REQUIRE(f->kvs().size() == kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    INFO("key " << kvs[i].key);
    CHECK(f->kvs()[i].key == kvs[i].key);  // order kept
    CHECK(same_value(f->kvs()[i].value, kvs[i].value));
  }
  CHECK(f->tensors().empty());
  CHECK(f->data_offset() == w.data_offset());
  CHECK(f->data_offset() % 32 == 0);
  // Spot checks through the typed getters, independent of same_value.
  CHECK(f->get_int("t.i64").value() == std::numeric_limits<int64_t>::min());
  CHECK(f->get_uint("t.u64").value() == std::numeric_limits<uint64_t>::max());
  CHECK(f->get_string("t.str_nul").value() == std::string("a\0b", 3));
  CHECK(std::isnan(f->find("t.f32_nan")->f));
  CHECK(std::signbit(f->find("t.f64_negzero")->f));
  CHECK(f->find("t.nested")->element(2).element(0).element(0).as_i64() == -9);
}

TEST_CASE("writer: exact header bytes of a minimal file") {
  Writer w;
  w.add_kv("a", val::u8(7));
  w.add_tensor("t", 0, {2});
  auto h = w.header_bytes();
  REQUIRE(h.ok());
  std::vector<uint8_t> expect = {'G', 'G', 'U', 'F', 3, 0, 0, 0,
                                 1, 0, 0, 0, 0, 0, 0, 0,      // tensor count
                                 1, 0, 0, 0, 0, 0, 0, 0,      // kv count
                                 1, 0, 0, 0, 0, 0, 0, 0, 'a', // key
                                 0, 0, 0, 0, 7,               // u8 7
                                 1, 0, 0, 0, 0, 0, 0, 0, 't', // tensor name
                                 1, 0, 0, 0,                  // n_dims
                                 2, 0, 0, 0, 0, 0, 0, 0,      // ne0
                                 0, 0, 0, 0,                  // F32
                                 0, 0, 0, 0, 0, 0, 0, 0};     // offset
  CHECK(w.data_offset() == 96);  // 24 + 14 + 33 = 71 bytes, aligned to 32
  CHECK(expect.size() == 71);
  expect.resize(96, 0);
  CHECK(*h == expect);
  CHECK(w.total_size() == 96 + 32);
}

TEST_CASE("writer: set_kv replaces a value in place; a u64 array keeps its size") {
  Writer w;
  w.add_kv("first", val::u32(1));
  w.add_kv("sums", val::u64_array({0, 0, 0}));
  w.add_kv("last", val::str("x"));
  w.add_tensor("t", 0, {8});
  auto before = w.header_bytes();
  REQUIRE(before.ok());
  REQUIRE(w.set_kv("sums", val::u64_array({1, UINT64_MAX, 42})).ok());
  auto after = w.header_bytes();
  REQUIRE(after.ok());
  CHECK(after->size() == before->size());
  CHECK(*after != *before);
  auto file = gguf_bytes(w, {std::vector<uint8_t>(32, 0)});
  REQUIRE(file.ok());
  auto f = parse_bytes(*file);
  REQUIRE(f.ok());
  REQUIRE(f->kvs().size() == 3);
  CHECK(f->kvs()[1].key == "sums");
  const Value& v = f->kvs()[1].value;
  REQUIRE(v.array_size() == 3);
  CHECK(v.elem_type == ValueType::U64);
  CHECK(v.element(0).u == 1);
  CHECK(v.element(1).u == UINT64_MAX);
  CHECK(v.element(2).u == 42);
  CHECK(f->kvs()[2].key == "last");
  auto missing = w.set_kv("absent", val::u8(0));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == XPACK_E_NOT_FOUND);
}

TEST_CASE("writer: tensor layout, data placement and padding") {
  for (uint32_t alignment : {32u, 64u, 4096u}) {
    INFO("alignment " << alignment);
    Writer w(alignment);
    w.add_kv("general.architecture", val::str("test"));
    if (alignment != 32) w.add_kv("general.alignment", val::u32(alignment));
    w.add_tensor("a", 0, {3});                       // 12 bytes
    w.add_tensor("b", 8, {64, 3});                   // Q8_0: 6 blocks of 34
    w.add_tensor("c", 39, {32, 5, 4});               // MXFP4: 20 blocks of 17
    w.add_tensor("d", 11, {256, 1, 3});              // Q3_K: 3 blocks of 110
    w.add_tensor("e", 30, {1});                      // BF16
    CHECK(w.tensor_nbytes(0) == 12);
    CHECK(w.tensor_nbytes(1) == 204);
    CHECK(w.tensor_nbytes(2) == 340);
    CHECK(w.tensor_nbytes(3) == 330);
    CHECK(w.tensor_nbytes(4) == 2);
    std::vector<std::vector<uint8_t>> data;
    for (size_t i = 0; i < w.tensor_count(); ++i) {
      CHECK(w.tensor_offset(i) % alignment == 0);
      if (i > 0) CHECK(w.tensor_offset(i) >= w.tensor_offset(i - 1) + w.tensor_nbytes(i - 1));
      if (i > 0) CHECK(w.tensor_offset(i) < w.tensor_offset(i - 1) + w.tensor_nbytes(i - 1) + alignment);
      data.push_back(pattern_bytes(i, w.tensor_nbytes(i)));
    }
    CHECK(w.data_offset() % alignment == 0);
    CHECK(w.total_size() % alignment == 0);

    test::TempDir dir;
    std::string path = (dir / "x.gguf").string();
    REQUIRE(write_gguf(path, w, data).ok());
    auto bytes = test::read_file(path);
    CHECK(bytes.size() == w.total_size());
    CHECK(bytes == gguf_bytes(w, data).value());

    auto m = Model::open(path);
    REQUIRE_MESSAGE(m.ok(), m.error().message);
    CHECK(m->meta().alignment() == alignment);
    CHECK(m->meta().data_offset() == w.data_offset());
    REQUIRE(m->tensors().size() == 5);
    std::vector<bool> covered(bytes.size(), false);
    for (size_t i = 0; i < 5; ++i) {
      const auto& t = m->tensors()[i];
      CHECK(t.name == w.tensor_name(i));
      CHECK(t.offset == w.tensor_offset(i));
      CHECK(t.nbytes == w.tensor_nbytes(i));
      auto p = m->tensor_data(t);
      REQUIRE(p.ok());
      CHECK(std::memcmp(*p, data[i].data(), data[i].size()) == 0);
      for (uint64_t k = 0; k < t.nbytes; ++k) covered[t.file_offset + k] = true;
    }
    // Everything after the header that is not tensor data is zero.
    bool gaps_zero = true;
    auto h = w.header_bytes().value();
    for (size_t k = h.size(); k < bytes.size(); ++k)
      if (!covered[k] && bytes[k] != 0) gaps_zero = false;
    CHECK(gaps_zero);
  }
}

TEST_CASE("writer: the filler callback variant writes the same file") {
  Writer w;
  w.add_tensor("a", 0, {5});
  w.add_tensor("b", 1, {7, 2});
  std::vector<std::vector<uint8_t>> data{pattern_bytes(0, 20), pattern_bytes(1, 28)};
  test::TempDir dir;
  auto path = (dir / "y.gguf").string();
  REQUIRE(write_gguf(path, w, [&](size_t i, uint8_t* dst, size_t n) -> Status {
            REQUIRE(n == data[i].size());
            std::memcpy(dst, data[i].data(), n);
            return {};
          }).ok());
  CHECK(test::read_file(path) == gguf_bytes(w, data).value());
  // A failing filler leaves no file behind.
  auto path2 = (dir / "z.gguf").string();
  auto s = write_gguf(path2, w, [](size_t, uint8_t*, size_t) -> Status {
    return err(XPACK_E_INTERNAL, "boom");
  });
  CHECK(!s.ok());
  CHECK(!std::filesystem::exists(path2));
  CHECK(!std::filesystem::exists(path2 + ".tmp"));
}

TEST_CASE("writer: refuses inconsistent input") {
  auto fails_with = [](const Writer& w, int code) {
    auto h = w.header_bytes();
    REQUIRE(!h.ok());
    CHECK(h.error().code == code);
    CHECK(!h.error().message.empty());
  };
  SUBCASE("duplicate key") {
    Writer w;
    w.add_kv("k", val::u8(1));
    w.add_kv("k", val::u8(2));
    fails_with(w, XPACK_E_DUPLICATE);
  }
  SUBCASE("duplicate tensor") {
    Writer w;
    w.add_tensor("t", 0, {1});
    w.add_tensor("t", 0, {1});
    fails_with(w, XPACK_E_DUPLICATE);
  }
  SUBCASE("unknown type") {
    Writer w;
    w.add_tensor("t", 4, {32});
    fails_with(w, XPACK_E_UNKNOWN_TYPE);
  }
  SUBCASE("bad shapes") {
    for (auto ne : std::vector<std::vector<uint64_t>>{{}, {1, 1, 1, 1, 1}, {0}, {4, 0}}) {
      Writer w;
      w.add_tensor("t", 0, ne);
      fails_with(w, XPACK_E_INVALID_ARG);
      CHECK(w.tensor_nbytes(0) == 0);
    }
    Writer w;
    w.add_tensor("q", 10, {100, 2});  // Q2_K needs ne0 % 256 == 0
    fails_with(w, XPACK_E_FORMAT);
  }
  SUBCASE("bad alignment") {
    fails_with(Writer(0), XPACK_E_INVALID_ARG);
    fails_with(Writer(12), XPACK_E_INVALID_ARG);
    Writer w(64);
    w.add_kv("general.alignment", val::u32(32));  // disagrees with the layout
    fails_with(w, XPACK_E_INVALID_ARG);
  }
  SUBCASE("array element of the wrong type") {
    Writer w;
    w.add_kv("a", val::array(ValueType::U32, {val::u32(1), val::u16(2)}));
    fails_with(w, XPACK_E_INVALID_ARG);
  }
  SUBCASE("bool that is neither 0 nor 1") {
    Value b = val::boolean(true);
    b.u = 2;
    Writer w;
    w.add_kv("b", b);
    fails_with(w, XPACK_E_INVALID_ARG);
  }
  SUBCASE("arrays nested too deep") {
    Value v = val::u32_array({1});
    for (uint32_t d = 0; d < kMaxArrayDepth; ++d) v = val::array(ValueType::ARRAY, {v});
    Writer w;
    w.add_kv("deep", v);
    fails_with(w, XPACK_E_LIMIT);
  }
  SUBCASE("data of the wrong size") {
    Writer w;
    w.add_tensor("t", 0, {4});
    CHECK(!gguf_bytes(w, {std::vector<uint8_t>(15)}).ok());
    CHECK(!gguf_bytes(w, {}).ok());
    test::TempDir dir;
    CHECK(!write_gguf((dir / "w.gguf").string(), w, {std::vector<uint8_t>(17)}).ok());
  }
}
