// The reader against malformed and hostile files: every case must fail with a
// specific code and a message, never crash or allocate what the file claims.
#include <doctest/doctest.h>

#include <string>

#include <sys/resource.h>

#include "fixtures.h"
#include "gguf/gguf_model.h"
#include "gguf_test_util.h"
#include "xpack/xpack.h"

using namespace xpack;
using namespace xpack::gguf;
using xpack::test::parse_bytes;
using xpack::test::RawGguf;

namespace {

void expect_error(const std::vector<uint8_t>& bytes, int code, const std::string& needle = "") {
  auto f = parse_bytes(bytes);
  REQUIRE_MESSAGE(!f.ok(), "a malformed file was accepted");
  CHECK_MESSAGE(f.error().code == code, f.error().message);
  CHECK(!f.error().message.empty());
  if (!needle.empty())
    CHECK_MESSAGE(f.error().message.find(needle) != std::string::npos, f.error().message);
}

std::vector<uint8_t> le64(uint64_t v) {
  std::vector<uint8_t> b;
  wire::put_u64(b, v);
  return b;
}

}  // namespace

TEST_CASE("hostile: the valid baseline parses") {
  auto bytes = test::small_gguf();
  REQUIRE(!bytes.empty());
  auto f = parse_bytes(bytes);
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  CHECK(f->tensors().size() == 3);
  auto raw = RawGguf(1, 1).kv("general.architecture", val::str("x")).tensor("t", {8}, 0, 0).data(32, 32);
  CHECK(parse_bytes(raw.b).ok());
}

TEST_CASE("hostile: truncation at every byte of the header and data") {
  auto bytes = test::small_gguf();
  auto full = parse_bytes(bytes);
  REQUIRE(full.ok());
  uint64_t data_end = 0;
  for (const auto& t : full->tensors()) data_end = std::max(data_end, t.file_offset + t.nbytes);
  REQUIRE(data_end <= bytes.size());
  int wrong_code = 0;
  for (size_t n = 0; n < data_end; ++n) {
    test::MemorySource src(bytes, n);
    auto f = File::parse(src, "cut.gguf");
    if (f.ok()) {
      FAIL("a file cut at byte " << n << " of " << data_end << " was accepted");
      continue;
    }
    if (f.error().code != XPACK_E_TRUNCATED) {
      ++wrong_code;
      MESSAGE("cut at " << n << ": code " << f.error().code << " " << f.error().message);
    }
  }
  CHECK(wrong_code == 0);
}

TEST_CASE("hostile: magic and version") {
  expect_error(RawGguf(0, 0, 3, 0x46554746u).b, XPACK_E_BAD_MAGIC);
  expect_error(RawGguf(0, 0, 1).b, XPACK_E_VERSION);
  expect_error(RawGguf(0, 0, 4).b, XPACK_E_VERSION);
  expect_error({'G', 'G'}, XPACK_E_TRUNCATED);
  expect_error({}, XPACK_E_TRUNCATED);
  // v2 has the same layout as v3 and is accepted.
  auto v2 = RawGguf(0, 1, 2).kv("general.architecture", val::str("x")).b;
  auto f = parse_bytes(v2);
  REQUIRE(f.ok());
  CHECK(f->version() == 2);
}

TEST_CASE("hostile: huge lengths and counts") {
  SUBCASE("huge key length") {
    auto r = RawGguf(0, 1);
    wire::put_u64(r.b, 1ull << 62);
    r.b.resize(r.b.size() + 64, 'k');
    auto f = parse_bytes(r.b);
    REQUIRE(!f.ok());
    CHECK((f.error().code == XPACK_E_LIMIT || f.error().code == XPACK_E_TRUNCATED));
  }
  SUBCASE("huge string value length") {
    auto r = RawGguf(0, 1).kv_raw("general.name", 8, le64(~0ull));
    r.b.resize(r.b.size() + 64, 's');
    expect_error(r.b, XPACK_E_LIMIT);
  }
  SUBCASE("string value longer than the file") {
    auto r = RawGguf(0, 1).kv_raw("general.name", 8, le64(1000));
    r.b.resize(r.b.size() + 10, 's');
    expect_error(r.b, XPACK_E_TRUNCATED);
  }
  SUBCASE("huge array count") {
    std::vector<uint8_t> p;
    wire::put_u32(p, 4);  // u32 elements
    wire::put_u64(p, 1ull << 61);
    auto r = RawGguf(0, 1).kv_raw("tokenizer.ggml.scores", 9, p);
    r.b.resize(r.b.size() + 64, 0);
    expect_error(r.b, XPACK_E_TRUNCATED, "tokenizer.ggml.scores");
  }
  SUBCASE("huge array of strings / of arrays") {
    for (uint32_t et : {8u, 9u}) {
      std::vector<uint8_t> p;
      wire::put_u32(p, et);
      wire::put_u64(p, ~0ull);
      auto r = RawGguf(0, 1).kv_raw("a", 9, p);
      r.b.resize(r.b.size() + 256, 0);
      auto f = parse_bytes(r.b);
      REQUIRE(!f.ok());
      CHECK((f.error().code == XPACK_E_TRUNCATED || f.error().code == XPACK_E_LIMIT));
    }
  }
  SUBCASE("huge tensor count") {
    expect_error(RawGguf(1ull << 62, 0).data(32, 64).b, XPACK_E_LIMIT);
    expect_error(RawGguf(100000, 0).data(32, 64).b, XPACK_E_TRUNCATED);
  }
  SUBCASE("huge kv count") {
    expect_error(RawGguf(0, ~0ull).b, XPACK_E_LIMIT);
    expect_error(RawGguf(0, 1000).data(32, 64).b, XPACK_E_TRUNCATED);
  }
  SUBCASE("arrays nested deeper than the limit") {
    std::vector<uint8_t> p;
    for (uint32_t d = 0; d < kMaxArrayDepth + 1; ++d) {
      wire::put_u32(p, 9);
      wire::put_u64(p, 1);
    }
    wire::put_u32(p, 0);
    wire::put_u64(p, 0);
    expect_error(RawGguf(0, 1).kv_raw("deep", 9, p).b, XPACK_E_LIMIT, "deep");
  }
}

TEST_CASE("hostile: bad values") {
  expect_error(RawGguf(0, 1).kv_raw("flag", 7, {2}).b, XPACK_E_FORMAT, "flag");
  expect_error(RawGguf(0, 1).kv_raw("x", 13, {0, 0, 0, 0}).b, XPACK_E_FORMAT);
  std::vector<uint8_t> p;
  wire::put_u32(p, 77);  // unknown element type
  wire::put_u64(p, 1);
  p.resize(p.size() + 8, 0);
  expect_error(RawGguf(0, 1).kv_raw("arr", 9, p).b, XPACK_E_FORMAT, "arr");
  expect_error(RawGguf(0, 2).kv("k", val::u8(1)).kv("k", val::u8(1)).b, XPACK_E_DUPLICATE, "k");
}

TEST_CASE("hostile: alignment") {
  for (uint32_t a : {0u, 12u, 1u, 7u}) {
    INFO("alignment " << a);
    expect_error(RawGguf(0, 1).kv("general.alignment", val::u32(a)).b, XPACK_E_FORMAT);
  }
  expect_error(RawGguf(0, 1).kv("general.alignment", val::str("32")).b, XPACK_E_FORMAT);
  // A valid non-default alignment moves the data section.
  auto ok = RawGguf(1, 1).kv("general.alignment", val::u32(64)).tensor("t", {4}, 0, 0).data(64, 64);
  auto f = parse_bytes(ok.b);
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  CHECK(f->alignment() == 64);
  CHECK(f->data_offset() % 64 == 0);
}

TEST_CASE("hostile: tensor infos") {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, uint64_t data = 256) {
    return RawGguf(1, 0).tensor("blk.0.bad", std::move(ne), type, offset).data(32, data).b;
  };
  SUBCASE("n_dims > 4 and n_dims == 0") {
    expect_error(one({1, 1, 1, 1, 1}, 0, 0), XPACK_E_FORMAT, "blk.0.bad");
    expect_error(one({}, 0, 0), XPACK_E_FORMAT, "blk.0.bad");
  }
  SUBCASE("a zero dimension is accepted as an empty tensor") {
    auto f = parse_bytes(RawGguf(1, 0).tensor("empty", {0, 4}, 0, 0).data(32, 32).b);
    REQUIRE_MESSAGE(f.ok(), f.error().message);
    CHECK(f->tensors()[0].nbytes == 0);
  }
  SUBCASE("negative dimension") { expect_error(one({~0ull}, 0, 0), XPACK_E_FORMAT, "blk.0.bad"); }
  SUBCASE("dims whose product overflows") {
    expect_error(one({1ull << 32, 1ull << 32, 1ull << 32}, 0, 0), XPACK_E_LIMIT, "blk.0.bad");
    expect_error(one({1ull << 62, 4}, 0, 0), XPACK_E_LIMIT, "blk.0.bad");
  }
  SUBCASE("unknown type ids name the tensor and the id") {
    for (uint32_t id : {4u, 5u, 31u, 36u, 40u, 1000u, 0xFFFFFFFFu}) {
      INFO("type " << id);
      expect_error(one({32}, id, 0), XPACK_E_UNKNOWN_TYPE, "blk.0.bad");
      auto f = parse_bytes(one({32}, id, 0));
      CHECK(f.error().message.find(std::to_string(id)) != std::string::npos);
    }
  }
  SUBCASE("ne0 not a multiple of the block size") {
    expect_error(one({100}, 10, 0), XPACK_E_FORMAT, "blk.0.bad");
  }
  SUBCASE("data past the end of the file") {
    expect_error(one({64}, 0, 0, 128), XPACK_E_TRUNCATED, "blk.0.bad");
    expect_error(one({8}, 0, 1ull << 40), XPACK_E_TRUNCATED, "blk.0.bad");
    expect_error(one({8}, 0, ~0ull & ~31ull), XPACK_E_TRUNCATED, "blk.0.bad");
  }
  SUBCASE("misaligned offset") { expect_error(one({8}, 0, 4), XPACK_E_MISALIGNED, "blk.0.bad"); }
  SUBCASE("over-long tensor name") {
    auto r = RawGguf(1, 0).tensor(std::string(kMaxTensorNameBytes + 1, 'n'), {8}, 0, 0).data(32, 32);
    expect_error(r.b, XPACK_E_LIMIT);
  }
  SUBCASE("overlapping tensors") {
    auto r = RawGguf(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).data(32, 128);
    expect_error(r.b, XPACK_E_OVERLAP);
    auto same = RawGguf(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 0).data(32, 128);
    expect_error(same.b, XPACK_E_OVERLAP);
    auto adjacent = RawGguf(2, 0).tensor("a", {8}, 0, 32).tensor("b", {8}, 0, 0).data(32, 128);
    CHECK(parse_bytes(adjacent.b).ok());
  }
  SUBCASE("duplicate tensor name") {
    auto r = RawGguf(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).data(32, 128);
    expect_error(r.b, XPACK_E_DUPLICATE, "'a'");
  }
}

namespace {
long peak_rss_kib() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}
}  // namespace

// KNOWN READER BUG (reported to the lead): every array element becomes a full
// gguf::Value (88 bytes), so a 4 MiB file holding one u8 array of 4 Mi elements
// makes the reader allocate ~370 MB; a 1 GiB hostile file would need ~90 GiB.
// Marked should_fail: when the reader stores scalar arrays compactly this test
// passes, the suite reports it, and the decorator should be removed.
TEST_CASE("hostile: a metadata array costs at most a small multiple of its file bytes") {
  const uint64_t n = 4u << 20;
  std::vector<uint8_t> payload;
  wire::put_u32(payload, 0);  // u8 elements
  wire::put_u64(payload, n);
  payload.resize(payload.size() + n, 1);
  auto raw = RawGguf(0, 1).kv_raw("big", 9, payload);
  long before = peak_rss_kib();
  {
    auto f = parse_bytes(raw.b);
    REQUIRE(f.ok());
    CHECK(f->find("big")->array_size() == n);
  }
  long grown_kib = peak_rss_kib() - before;
  MESSAGE("parsing a " << raw.b.size() / 1024 << " KiB file grew the peak RSS by " << grown_kib
                       << " KiB");
  CHECK(grown_kib < static_cast<long>(16 * raw.b.size() / 1024));
}

TEST_CASE("hostile: a FIFO is refused before the open can block") {
  xpack::test::TempDir dir;
  auto fifo = xpack::test::make_fifo(dir / "model.gguf");
  auto split = xpack::test::make_fifo(dir / "m-00001-of-00002.gguf");
  auto expect_refused = [&](const std::filesystem::path& p, auto open_it) {
    int code = 0;
    std::string msg;
    bool returned = xpack::test::returns_without_writer(p, [&] {
      auto r = open_it(p);
      if (!r.ok()) {
        code = r.error().code;
        msg = r.error().message;
      }
    });
    CHECK_MESSAGE(returned, "open of a FIFO blocked waiting for a writer: " << p);
    CHECK_MESSAGE(code == XPACK_E_INVALID_ARG, msg);
    CHECK_MESSAGE(msg.find("FIFO") != std::string::npos, msg);
  };
  expect_refused(fifo, [](const auto& p) { return File::open(p.string()); });
  expect_refused(fifo, [](const auto& p) { return Model::open(p.string()); });
  expect_refused(split, [](const auto& p) { return Model::open(p.string()); });
  // The C API: xpack_gguf_open on the FIFO.
  int rc = 0;
  std::string msg;  // xpack_last_error() is per thread: read it on the opening one
  bool returned = xpack::test::returns_without_writer(fifo, [&] {
    xpack_gguf* g = nullptr;
    rc = xpack_gguf_open(fifo.c_str(), nullptr, &g);
    msg = xpack_last_error();
    xpack_gguf_close(g);
  });
  CHECK(returned);
  CHECK(rc == XPACK_E_INVALID_ARG);
  CHECK_MESSAGE(msg.find("FIFO") != std::string::npos, msg);
  // A directory is refused the same way.
  auto d = File::open(dir.path().string());
  REQUIRE(!d.ok());
  CHECK(d.error().message.find("directory") != std::string::npos);
}
