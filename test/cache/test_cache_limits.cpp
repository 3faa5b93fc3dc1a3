// The I/O knobs' one home (io/engine_defaults.h): the engine and the cache take
// the same read_splits limit, the C API's options_init and a zero field give the
// same defaults, and include/xpack/xpack.h's comments state those values. Also
// the cache's option checks and slot sizing (cache/sizing.h) on their own.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "cache/expert_cache.h"
#include "cache/sizing.h"
#include "common/checked_math.h"
#include "io/engine_defaults.h"
#include "io/read_engine.h"
#include "object_file.h"
#include "xpack/xpack.h"

using namespace xpack;
using namespace xpack::cache;

namespace {

// 20 pages: enough for a 256-way split to be cut into fewer ranges than asked,
// and for a 16-way split to be cut exactly.
constexpr uint64_t kObj = 20 * 4096 - 100;

std::string header_text() {
  std::ifstream f(test::data_dir() / ".." / ".." / "include" / "xpack" / "xpack.h");
  REQUIRE_MESSAGE(f.good(), "include/xpack/xpack.h not found from test/data");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The "(...)" comment of field `field` in struct `type` of xpack.h.
std::string field_comment(const std::string& text, const std::string& type,
                          const std::string& field) {
  size_t begin = text.find("typedef struct " + type + " {");
  REQUIRE_MESSAGE(begin != std::string::npos, type);
  size_t end = text.find("}", begin);
  std::string body = text.substr(begin, end - begin);
  std::smatch m;
  std::regex re("uint32_t " + field + ";\\s*/\\*[^*]*\\(([^)]*)\\)\\s*\\*/");
  REQUIRE_MESSAGE(std::regex_search(body, m, re), type << "." << field);
  return m[1];
}

int engine_code(uint32_t splits) {
  test::TempDir dir;
  test::write_file(dir / "f.bin", std::vector<uint8_t>(8192, 1));
  io::EngineConfig c;
  c.paths = {(dir / "f.bin").string()};
  c.slot_bytes = 8192;
  c.read_splits = splits;
  c.direct_io = false;  // tmpfs may refuse O_DIRECT; the limit is what is tested
  auto e = io::ReadEngine::create(c);
  return e.ok() ? 0 : e.error().code;
}

}  // namespace

TEST_CASE("xpack.h states the defaults and limits of io/engine_defaults.h") {
  const std::string h = header_text();
  const std::string d8 = "0 = default " + std::to_string(io::kDefaultStagingBuffers);
  const std::string d64 = "0 = default " + std::to_string(io::kDefaultQueueDepth);
  const std::string d1 = "0 = default " + std::to_string(io::kDefaultReadSplits);
  const std::string lim = "1.." + std::to_string(io::kMaxReadSplits);
  CHECK(field_comment(h, "xpack_engine_options", "slots").find(d8) != std::string::npos);
  CHECK(field_comment(h, "xpack_engine_options", "queue_depth").find(d64) != std::string::npos);
  CHECK(field_comment(h, "xpack_engine_options", "read_splits") == lim + ", " + d1);
  CHECK(field_comment(h, "xpack_cache_options", "staging_slots") ==
        "1.." + std::to_string(kMaxStagingBuffers) + ", " + d8);
  CHECK(field_comment(h, "xpack_cache_options", "read_splits") == lim + ", " + d1);
  CHECK(field_comment(h, "xpack_cache_options", "queue_depth").find(d64) != std::string::npos);
}

TEST_CASE("options_init gives the defaults of io/engine_defaults.h") {
  xpack_engine_options eo;
  REQUIRE(xpack_engine_options_init(&eo) == 0);
  CHECK(eo.slots == io::kDefaultStagingBuffers);
  CHECK(eo.queue_depth == io::kDefaultQueueDepth);
  CHECK(eo.read_splits == io::kDefaultReadSplits);
  xpack_cache_options co;
  REQUIRE(xpack_cache_options_init(&co) == 0);
  CHECK(co.staging_slots == io::kDefaultStagingBuffers);
  CHECK(co.queue_depth == io::kDefaultQueueDepth);
  CHECK(co.read_splits == io::kDefaultReadSplits);
  CacheOptions cpp;
  CHECK(cpp.staging_slots == io::kDefaultStagingBuffers);
  CHECK(cpp.queue_depth == io::kDefaultQueueDepth);
  CHECK(cpp.read_splits == io::kDefaultReadSplits);
  io::EngineConfig ec;
  CHECK(ec.slot_count == io::kDefaultStagingBuffers);
  CHECK(ec.queue_depth == io::kDefaultQueueDepth);
  CHECK(ec.read_splits == io::kDefaultReadSplits);
}

TEST_CASE("the engine and the cache take read_splits 1..kMaxReadSplits, no more") {
  // 256: the engine's limit since its first version (xpack-fio and bench-cache
  // take --splits up to 256 and hand it to the cache); the cache refused 65..256.
  CHECK(io::kMaxReadSplits == 256);
  CHECK(engine_code(1) == 0);
  CHECK(engine_code(io::kMaxReadSplits) == 0);
  CHECK(engine_code(io::kMaxReadSplits + 1) == XPACK_E_INVALID_ARG);
  CHECK(engine_code(0) == XPACK_E_INVALID_ARG);

  test::TempDir dir;
  ObjectSource src = test::write_object_file(dir / "objects.bin", 1, 4, kObj, 1);
  auto dev = device::make_host_device();
  for (uint32_t splits : {65u, 16u, io::kMaxReadSplits}) {
    CAPTURE(splits);
    CacheOptions o;
    o.read_splits = splits;
    o.verify = true;
    o.budget_bytes = 2 * align_up(kObj, kSlotAlignment);
    auto c = ExpertCache::create(src, *dev, o);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
    uint32_t ids[] = {3};
    auto a = (*c)->acquire(0, ids, 1);
    REQUIRE(a.ok());
    REQUIRE((*c)->wait(a->ticket, 0).ok());
    std::vector<uint8_t> got(kObj);
    REQUIRE(dev->copy_to_host(got.data(), a->experts[0].data, kObj).ok());
    CHECK(got == test::expected_object(0, 3, kObj));
    CHECK((*c)->release(a->ticket).ok());
    CHECK((*c)->counters().pack_reads == 1);
  }
  for (uint32_t splits : {0u, io::kMaxReadSplits + 1}) {
    CAPTURE(splits);
    CacheOptions o;
    o.read_splits = splits;
    auto c = ExpertCache::create(src, *dev, o);
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code == XPACK_E_INVALID_ARG);
    CHECK(c.error().message.find("1.." + std::to_string(io::kMaxReadSplits)) != std::string::npos);
  }
}

TEST_CASE("check_options refuses what the cache cannot run with") {
  test::TempDir dir;
  ObjectSource src = test::write_object_file(dir / "objects.bin", 2, 4, 5000, 2);
  CHECK(check_options(src, {}).ok());
  auto code = [&](ObjectSource s, CacheOptions o) {
    Status st = check_options(s, o);
    return st.ok() ? 0 : st.error().code;
  };
  ObjectSource s = src;
  s.n_experts = 0;
  CHECK(code(s, {}) == XPACK_E_INVALID_ARG);
  s = src;
  s.offset = nullptr;
  CHECK(code(s, {}) == XPACK_E_INVALID_ARG);
  s = src;
  s.read_bytes = 4096;  // shorter than the object
  CHECK(code(s, {}) == XPACK_E_MISALIGNED);
  s = src;
  s.read_bytes = 8192 + 512;
  CHECK(code(s, {}) == XPACK_E_MISALIGNED);
  CacheOptions o;
  o.policy = PolicyKind::kBelady;
  CHECK(code(src, o) == XPACK_E_INVALID_ARG);
  o.policy = PolicyKind::kOracleLfu;  // needs the whole trace too
  CHECK(code(src, o) == XPACK_E_INVALID_ARG);
  o = {};
  o.staging_slots = 0;
  CHECK(code(src, o) == XPACK_E_INVALID_ARG);
  o.staging_slots = kMaxStagingBuffers;
  CHECK(code(src, o) == 0);
  o.staging_slots = kMaxStagingBuffers + 1;
  CHECK(code(src, o) == XPACK_E_INVALID_ARG);
  o = {};
  o.verify = true;
  s = src;
  s.checksum = nullptr;
  CHECK(code(s, o) == XPACK_E_INVALID_ARG);
  CHECK(code(src, o) == 0);
}

TEST_CASE("size_slots: floor(min(budget, free - reserve) / stride), capped, at least top-k") {
  test::TempDir dir;
  // 5000 B objects: stride 5120 (256-aligned); 2 layers x 4 experts = 8 objects.
  ObjectSource src = test::write_object_file(dir / "objects.bin", 2, 4, 5000, 2);
  device::MemoryInfo mem{100000, 200000};
  CacheOptions o;
  o.budget_bytes = 3 * 5120 + 5119;
  auto z = size_slots(src, o, mem);
  REQUIRE(z.ok());
  CHECK(z->stride == 5120);
  CHECK(z->count == 3);
  o.budget_bytes = 0;  // all free memory minus the reserve, capped at 8 objects
  CHECK(size_slots(src, o, mem)->count == 8);
  o.reserve_bytes = 100000 - 4 * 5120;  // leaves exactly four slots
  CHECK(size_slots(src, o, mem)->count == 4);
  o.budget_bytes = 10 * 5120;  // the budget is larger than what is free
  CHECK(size_slots(src, o, mem)->count == 4);
  o.reserve_bytes = 100000 - 5120;  // one slot, fewer than top-k = 2
  auto r = size_slots(src, o, mem);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == XPACK_E_CAPACITY);
  CHECK(r.error().message.find("fewer than top-k = 2") != std::string::npos);
  o.reserve_bytes = 200000;  // more than is free
  CHECK(size_slots(src, o, mem).error().code == XPACK_E_CAPACITY);
}
