// The xpack_gguf_* C API: accessors, error codes and messages, size-versioned
// structs, NULL handling.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <limits>
#include <string>

#include "fixtures.h"
#include "gguf/gguf_model.h"
#include "gguf_test_util.h"
#include "xpack/xpack.h"
#include "skip.h"

using namespace xpack;
namespace fs = std::filesystem;

namespace {

// A file with one key of every kind the accessors distinguish.
std::string write_kv_file(const test::TempDir& dir) {
  using namespace gguf::val;
  gguf::Writer w;
  w.add_kv("general.architecture", str("llama"));
  w.add_kv("i8", i8(-7));
  w.add_kv("u64_big", u64(std::numeric_limits<uint64_t>::max()));
  w.add_kv("u64_small", u64(1ull << 40));
  w.add_kv("i64_min", i64(std::numeric_limits<int64_t>::min()));
  w.add_kv("f32", f32(0.25f));
  w.add_kv("flag", boolean(true));
  w.add_kv("ints", i32_array({-1, 2, 3}));
  w.add_kv("floats", f32_array({1.5f, -2.5f}));
  w.add_kv("strs", str_array({"a", "", "xyz"}));
  w.add_kv("nested", array(gguf::ValueType::ARRAY, {u32_array({1})}));
  w.add_tensor("t0", XPACK_TYPE_F32, {4, 2});
  w.add_tensor("blk.0.ffn_up_exps.weight", XPACK_TYPE_MXFP4, {64, 3, 2});
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < w.tensor_count(); ++i) data.push_back(test::pattern_bytes(i, w.tensor_nbytes(i)));
  std::string path = (dir / "kv.gguf").string();
  REQUIRE(gguf::write_gguf(path, w, data).ok());
  return path;
}

}  // namespace

TEST_CASE("capi: xpack_type_info") {
  const char* name = nullptr;
  uint32_t be = 0, bb = 0;
  CHECK(xpack_type_info(XPACK_TYPE_Q3_K, &name, &be, &bb) == 0);
  CHECK(std::string(name) == "Q3_K");
  CHECK(be == 256);
  CHECK(bb == 110);
  CHECK(xpack_type_info(XPACK_TYPE_MXFP4, nullptr, nullptr, &bb) == 0);
  CHECK(bb == 17);
  CHECK(xpack_type_info(4, &name, &be, &bb) == XPACK_E_UNKNOWN_TYPE);
  CHECK(std::string(xpack_last_error()).find('4') != std::string::npos);
}

TEST_CASE("capi: open failures leave *out NULL and set the thread's last error") {
  xpack_gguf* g = reinterpret_cast<xpack_gguf*>(0x1);
  CHECK(xpack_gguf_open("/nonexistent/x.gguf", nullptr, &g) == -ENOENT);
  CHECK(g == nullptr);
  CHECK(std::string(xpack_last_error()).find("/nonexistent/x.gguf") != std::string::npos);
  CHECK(xpack_gguf_open(nullptr, nullptr, &g) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_open("x", nullptr, nullptr) == XPACK_E_INVALID_ARG);

  test::TempDir dir;
  auto bad = dir / "bad.gguf";
  test::write_file(bad, {'G', 'G', 'U', 'F', 9, 0, 0, 0});
  CHECK(xpack_gguf_open(bad.c_str(), nullptr, &g) == XPACK_E_VERSION);
  CHECK(g == nullptr);
  CHECK(std::string(xpack_last_error()).find("version") != std::string::npos);

  // A real file cut inside its tensor data: the reader's code comes through.
  auto good = test::small_gguf();
  REQUIRE(!good.empty());
  auto cut = dir / "cut.gguf";
  test::write_file(cut, std::vector<uint8_t>(good.begin(), good.end() - 64));
  CHECK(xpack_gguf_open(cut.c_str(), nullptr, &g) == XPACK_E_TRUNCATED);
  CHECK(g == nullptr);
  CHECK(std::string(xpack_last_error()).find("cut.gguf") != std::string::npos);
  auto whole = dir / "whole.gguf";
  test::write_file(whole, good);
  REQUIRE(xpack_gguf_open(whole.c_str(), nullptr, &g) == 0);
  CHECK(xpack_gguf_tensor_count(g) == 3);
  xpack_gguf_close(g);
  g = nullptr;

  xpack_gguf_options opts{};
  opts.size = 0;  // too small to be a real struct
  CHECK(xpack_gguf_open(bad.c_str(), &opts, &g) == XPACK_E_INVALID_ARG);
  opts.size = sizeof opts;
  opts.flags = 1u << 7;  // unknown flag
  CHECK(xpack_gguf_open(bad.c_str(), &opts, &g) == XPACK_E_INVALID_ARG);
  xpack_gguf_close(nullptr);  // accepted
}

TEST_CASE("capi: metadata accessors") {
  test::TempDir dir;
  std::string path = write_kv_file(dir);
  xpack_gguf* g = nullptr;
  REQUIRE(xpack_gguf_open(path.c_str(), nullptr, &g) == 0);
  REQUIRE(g);
  CHECK(xpack_gguf_version(g) == 3);
  CHECK(xpack_gguf_shard_count(g) == 1);
  CHECK(xpack_gguf_key_count(g) == 11);
  CHECK(std::string(xpack_gguf_errmsg(g)).empty());

  auto key = [&](const char* k) {
    int64_t i = xpack_gguf_find_key(g, k);
    REQUIRE_MESSAGE(i >= 0, k);
    CHECK(std::string(xpack_gguf_key_name(g, i)) == k);
    return i;
  };
  int64_t v;
  double d;
  const char* s;
  size_t len;
  CHECK(xpack_gguf_find_key(g, "nope") == XPACK_E_NOT_FOUND);
  CHECK(std::string(xpack_gguf_errmsg(g)).find("nope") != std::string::npos);

  CHECK(xpack_gguf_key_type(g, key("i8")) == XPACK_GGUF_I8);
  CHECK(xpack_gguf_get_int(g, key("i8"), &v) == 0);
  CHECK(v == -7);
  CHECK(xpack_gguf_get_float(g, key("i8"), &d) == 0);
  CHECK(d == -7.0);
  CHECK(xpack_gguf_get_int(g, key("u64_big"), &v) == XPACK_E_LIMIT);
  CHECK(xpack_gguf_get_float(g, key("u64_big"), &d) == 0);
  CHECK(d == 18446744073709551615.0);
  CHECK(xpack_gguf_get_int(g, key("u64_small"), &v) == 0);
  CHECK(v == (1ll << 40));
  CHECK(xpack_gguf_get_int(g, key("i64_min"), &v) == 0);
  CHECK(v == std::numeric_limits<int64_t>::min());
  CHECK(xpack_gguf_get_float(g, key("f32"), &d) == 0);
  CHECK(d == 0.25);
  CHECK(xpack_gguf_get_int(g, key("f32"), &v) == XPACK_E_TYPE);
  CHECK(std::string(xpack_gguf_errmsg(g)).find("f32") != std::string::npos);
  CHECK(xpack_gguf_get_int(g, key("flag"), &v) == 0);
  CHECK(v == 1);
  CHECK(xpack_gguf_get_string(g, key("general.architecture"), &s, &len) == 0);
  CHECK(std::string(s, len) == "llama");
  CHECK(xpack_gguf_get_string(g, key("flag"), &s, &len) == XPACK_E_TYPE);

  int et;
  uint64_t n;
  CHECK(xpack_gguf_get_array(g, key("ints"), &et, &n) == 0);
  CHECK(et == XPACK_GGUF_I32);
  CHECK(n == 3);
  CHECK(xpack_gguf_get_array_int(g, key("ints"), 0, &v) == 0);
  CHECK(v == -1);
  CHECK(xpack_gguf_get_array_int(g, key("ints"), 3, &v) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_get_array_float(g, key("floats"), 1, &d) == 0);
  CHECK(d == -2.5);
  CHECK(xpack_gguf_get_array_string(g, key("strs"), 2, &s, &len) == 0);
  CHECK(std::string(s, len) == "xyz");
  CHECK(xpack_gguf_get_array_string(g, key("strs"), 1, &s, &len) == 0);
  CHECK(len == 0);
  CHECK(xpack_gguf_get_array_string(g, key("ints"), 0, &s, &len) == XPACK_E_TYPE);
  CHECK(xpack_gguf_get_array(g, key("f32"), &et, &n) == XPACK_E_TYPE);
  CHECK(xpack_gguf_get_array_int(g, key("f32"), 0, &v) == XPACK_E_TYPE);
  CHECK(xpack_gguf_get_array(g, key("nested"), &et, &n) == 0);
  CHECK(et == XPACK_GGUF_ARRAY);
  CHECK(xpack_gguf_get_array_int(g, key("nested"), 0, &v) == XPACK_E_TYPE);

  CHECK(xpack_gguf_key_name(g, -1) == nullptr);
  CHECK(xpack_gguf_key_name(g, 11) == nullptr);
  CHECK(xpack_gguf_key_type(g, 11) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_get_int(g, 99, &v) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_find_key(g, nullptr) == XPACK_E_INVALID_ARG);
  xpack_gguf_close(g);
}

TEST_CASE("capi: NULL handles") {
  int64_t v;
  CHECK(xpack_gguf_version(nullptr) == 0);
  CHECK(xpack_gguf_shard_count(nullptr) == 0);
  CHECK(xpack_gguf_key_count(nullptr) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_tensor_count(nullptr) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_get_int(nullptr, 0, &v) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_find_tensor(nullptr, "x") == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_errmsg(nullptr) != nullptr);
  const void* p;
  CHECK(xpack_gguf_tensor_data(nullptr, 0, &p) == XPACK_E_INVALID_ARG);
}

TEST_CASE("capi: tensors, size-versioned info struct, data") {
  test::TempDir dir;
  std::string path = write_kv_file(dir);
  xpack_gguf* g = nullptr;
  REQUIRE(xpack_gguf_open(path.c_str(), nullptr, &g) == 0);
  CHECK(xpack_gguf_tensor_count(g) == 2);
  int64_t i = xpack_gguf_find_tensor(g, "blk.0.ffn_up_exps.weight");
  REQUIRE(i == 1);
  CHECK(xpack_gguf_find_tensor(g, "missing") == XPACK_E_NOT_FOUND);

  xpack_tensor_info ti{};
  ti.size = sizeof ti;
  REQUIRE(xpack_gguf_tensor_info(g, i, &ti) == 0);
  CHECK(std::string(ti.name) == "blk.0.ffn_up_exps.weight");
  CHECK(ti.type == XPACK_TYPE_MXFP4);
  CHECK(ti.n_dims == 3);
  CHECK(ti.ne[0] == 64);
  CHECK(ti.ne[1] == 3);
  CHECK(ti.ne[2] == 2);
  CHECK(ti.ne[3] == 1);
  CHECK(ti.nbytes == 2 * 3 * 2 * 17);
  CHECK(ti.shard == 0);
  auto bytes = test::read_file(path);
  REQUIRE(ti.file_offset + ti.nbytes <= bytes.size());
  const void* data = nullptr;
  REQUIRE(xpack_gguf_tensor_data(g, i, &data) == 0);
  CHECK(std::memcmp(data, bytes.data() + ti.file_offset, ti.nbytes) == 0);
  auto expect = test::pattern_bytes(1, ti.nbytes);
  CHECK(std::memcmp(data, expect.data(), ti.nbytes) == 0);

  // An older caller whose struct ends before nbytes: later fields stay untouched.
  xpack_tensor_info old;
  std::memset(&old, 0xEE, sizeof old);
  old.size = offsetof(xpack_tensor_info, nbytes);
  REQUIRE(xpack_gguf_tensor_info(g, i, &old) == 0);
  CHECK(old.type == XPACK_TYPE_MXFP4);
  CHECK(old.ne[2] == 2);
  CHECK(old.nbytes == 0xEEEEEEEEEEEEEEEEull);
  CHECK(old.file_offset == 0xEEEEEEEEEEEEEEEEull);

  xpack_tensor_info tiny{};
  tiny.size = 1;
  CHECK(xpack_gguf_tensor_info(g, i, &tiny) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_tensor_info(g, i, nullptr) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_tensor_info(g, 2, &ti) == XPACK_E_INVALID_ARG);
  CHECK(xpack_gguf_tensor_info(g, -1, &ti) == XPACK_E_INVALID_ARG);
  CHECK(std::string(xpack_gguf_errmsg(g)).find("-1") != std::string::npos);
  CHECK(xpack_gguf_tensor_data(g, 0, nullptr) == XPACK_E_INVALID_ARG);
  xpack_gguf_close(g);
}

TEST_CASE("capi: stories260K and the oracle split set") {
  xpack_gguf* g = nullptr;
  std::string stories = (test::data_dir() / "stories260K.gguf").string();
  REQUIRE(xpack_gguf_open(stories.c_str(), nullptr, &g) == 0);
  CHECK(xpack_gguf_tensor_count(g) == 48);
  CHECK(xpack_gguf_key_count(g) == 19);
  int64_t v;
  CHECK(xpack_gguf_get_int(g, xpack_gguf_find_key(g, "llama.block_count"), &v) == 0);
  CHECK(v == 5);
  xpack_gguf_close(g);

  auto shared = test::shared_dir();
  if (!shared) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared not present (oracle split set)");
    return;
  }
  std::string shard2 = (*shared / "oracle/models/kimi-k3-q2k-q3k-00002-of-00003.gguf").string();
  REQUIRE(xpack_gguf_open(shard2.c_str(), nullptr, &g) == 0);
  CHECK(xpack_gguf_shard_count(g) == 3);
  CHECK(xpack_gguf_tensor_count(g) == 102);
  int64_t i = xpack_gguf_find_tensor(g, "output.weight");
  REQUIRE(i >= 0);
  xpack_tensor_info ti{};
  ti.size = sizeof ti;
  REQUIRE(xpack_gguf_tensor_info(g, i, &ti) == 0);
  CHECK(ti.shard == 0);
  xpack_gguf_close(g);

  xpack_gguf_options opts{};
  opts.size = sizeof opts;
  opts.flags = XPACK_GGUF_SINGLE_FILE;
  REQUIRE(xpack_gguf_open(shard2.c_str(), &opts, &g) == 0);
  CHECK(xpack_gguf_shard_count(g) == 1);
  CHECK(xpack_gguf_tensor_count(g) == 34);
  xpack_gguf_close(g);

  // An options struct from a caller that predates `flags` still opens (defaults).
  xpack_gguf_options old{};
  old.size = sizeof(size_t);
  old.flags = XPACK_GGUF_SINGLE_FILE;  // beyond old.size: must be ignored
  REQUIRE(xpack_gguf_open(shard2.c_str(), &old, &g) == 0);
  CHECK(xpack_gguf_shard_count(g) == 3);
  xpack_gguf_close(g);
}

TEST_CASE("capi: concurrent accessors on one handle") {
  xpack_gguf* g = nullptr;
  std::string stories = (test::data_dir() / "stories260K.gguf").string();
  REQUIRE(xpack_gguf_open(stories.c_str(), nullptr, &g) == 0);
  const int64_t n_tensors = xpack_gguf_tensor_count(g);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        int64_t i = (rep * 7 + t) % n_tensors;
        xpack_tensor_info ti{};
        ti.size = sizeof ti;
        const void* p = nullptr;
        if (xpack_gguf_tensor_info(g, i, &ti) != 0 || xpack_gguf_tensor_data(g, i, &p) != 0 || !p)
          ++wrong;
        // Failing calls race on the handle's message; they must stay well-defined.
        if (xpack_gguf_find_key(g, "missing.key") != XPACK_E_NOT_FOUND) ++wrong;
        if (xpack_gguf_tensor_info(g, n_tensors + t, &ti) != XPACK_E_INVALID_ARG) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  xpack_gguf_close(g);
}
