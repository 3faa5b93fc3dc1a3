// The versioned-struct rule of xpack.h ("Conventions", doc/api.md) on every array
// call and on the sized structs: libxpack strides arrays by the caller's elem_size
// and touches only the bytes the caller's element (or struct) has; an older
// (smaller) size leaves what lies beyond it untouched, a newer (larger) one keeps
// its extra fields as they were, and a size below the first version is refused.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fixtures.h"
#include "pack/builder.h"
#include "xpack/xpack.h"

using namespace xpack;
using xpack::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr uint8_t kCanary = 0xAB;

struct Env {
  TempDir dir;
  xpack_pack* pack = nullptr;
  xpack_pack_info info{};
  Env() {
    auto synth = xpack::test::build_dir() / "tools" / "xpack-synth";
    if (!fs::exists(synth)) FAIL("xpack-synth is not built at " << synth.string());
    auto gguf = dir / "ds4.gguf";
    std::string out;
    int rc = xpack::test::run_command(
        synth.string() + " --arch deepseek4 --layers 3 --experts 8 --top-k 2 -q -o " + gguf.string(), &out);
    REQUIRE_MESSAGE(rc == 0, out);
    pack::BuildOptions bo;
    bo.source = gguf.string();
    bo.out = (dir / "ds4").string();
    auto rep = pack::build_pack(bo);
    REQUIRE_MESSAGE(rep.ok(), (rep.ok() ? "" : rep.error().message));
    REQUIRE_MESSAGE(xpack_pack_open(rep->pack_path.c_str(), nullptr, &pack) == 0, xpack_last_error());
    info.size = sizeof(info);
    REQUIRE(xpack_pack_get_info(pack, &info) == 0);
  }
  ~Env() { xpack_pack_close(pack); }
  xpack_cache* cache(uint32_t slots) {
    xpack_cache_options o;
    REQUIRE(xpack_cache_options_init(&o) == 0);
    o.device = XPACK_DEVICE_HOST;
    o.budget_bytes = slots * ((info.object_bytes + 255) / 256 * 256);
    xpack_cache* c = nullptr;
    REQUIRE_MESSAGE(xpack_cache_create(pack, &o, &c) == 0, xpack_last_error());
    return c;
  }
};

bool all_canary(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != kCanary) return false;
  return true;
}

template <class T>
T field_at(const std::vector<uint8_t>& buf, size_t elem, size_t elem_size, size_t offset) {
  T v;
  std::memcpy(&v, buf.data() + elem * elem_size + offset, sizeof v);
  return v;
}

}  // namespace

TEST_CASE("first-version sizes are the fields of today's structs") {
  CHECK(XPACK_READ_REQUEST_SIZE_V1 == 12);
  CHECK(XPACK_READ_COMPLETION_SIZE_V1 == 16);
  CHECK(XPACK_EXPERT_SLOT_SIZE_V1 == offsetof(xpack_expert_slot, hit) + 4);
  CHECK(sizeof(xpack_expert_slot) >= XPACK_EXPERT_SLOT_SIZE_V1);
}

TEST_CASE("cache: acquire and entry stride by the caller's element size") {
  Env env;
  xpack_cache* c = env.cache(4);
  const uint32_t ids[3] = {5, 2, 7};
  const size_t v1 = XPACK_EXPERT_SLOT_SIZE_V1;

  SUBCASE("the first version's size, packed without padding") {
    std::vector<uint8_t> buf(3 * v1 + 32, kCanary);
    uint64_t t = 0;
    REQUIRE_MESSAGE(xpack_cache_acquire_blocking(c, 1, ids, 3, 1, reinterpret_cast<xpack_expert_slot*>(buf.data()),
                                                 v1, &t) == 0,
                    xpack_cache_errmsg(c));
    for (size_t i = 0; i < 3; ++i) {
      CHECK(field_at<uint32_t>(buf, i, v1, offsetof(xpack_expert_slot, expert)) == ids[i]);
      const auto slot = field_at<uint32_t>(buf, i, v1, offsetof(xpack_expert_slot, slot));
      REQUIRE(slot < 4);
      void* want = nullptr;
      REQUIRE(xpack_cache_slot_pointer(c, slot, &want) == 0);
      CHECK(field_at<void*>(buf, i, v1, offsetof(xpack_expert_slot, data)) == want);
      CHECK(field_at<int32_t>(buf, i, v1, offsetof(xpack_expert_slot, hit)) == 0);
    }
    CHECK(all_canary(buf.data() + 3 * v1, 32));  // nothing past the caller's array
    // entry() with the same size into a buffer just as large.
    std::vector<uint8_t> one(v1 + 16, kCanary);
    REQUIRE(xpack_cache_entry(c, t, 2, reinterpret_cast<xpack_expert_slot*>(one.data()), v1) == 0);
    CHECK(field_at<uint32_t>(one, 0, v1, offsetof(xpack_expert_slot, expert)) == 7);
    CHECK(all_canary(one.data() + v1, 16));
    REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  }

  SUBCASE("a newer caller's larger element keeps its extra fields") {
    struct Newer {
      xpack_expert_slot s;
      uint64_t future[2];
    };
    Newer out[3];
    std::memset(out, kCanary, sizeof out);
    uint64_t t = 0;
    REQUIRE(xpack_cache_acquire(c, 0, ids, 3, 1, &out[0].s, sizeof(Newer), &t) == 0);
    REQUIRE(xpack_cache_wait_all(c, t) == 0);
    for (int i = 0; i < 3; ++i) {
      CHECK(out[i].s.expert == ids[i]);
      CHECK(out[i].s.slot < 4);
      CHECK(all_canary(reinterpret_cast<const uint8_t*>(out[i].future), sizeof out[i].future));
    }
    Newer e;
    std::memset(&e, kCanary, sizeof e);
    REQUIRE(xpack_cache_entry(c, t, 1, &e.s, sizeof e) == 0);
    CHECK(e.s.expert == 2);
    CHECK(e.s.slot == out[1].s.slot);
    CHECK(all_canary(reinterpret_cast<const uint8_t*>(e.future), sizeof e.future));
    REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  }

  SUBCASE("zero and too-small sizes are refused, touching nothing") {
    xpack_expert_slot s[3];
    std::memset(s, kCanary, sizeof s);
    uint64_t t = 99;
    for (size_t bad : {size_t(0), size_t(4), v1 - 1}) {
      CAPTURE(bad);
      CHECK(xpack_cache_acquire(c, 0, ids, 3, 1, s, bad, &t) == XPACK_E_INVALID_ARG);
      CHECK(std::string(xpack_cache_errmsg(c)).find("element size " + std::to_string(bad)) != std::string::npos);
      CHECK(t == 0);
      CHECK(xpack_cache_acquire_ex(c, 0, ids, 3, 1, XPACK_ACQUIRE_DEFER, s, bad, &t) == XPACK_E_INVALID_ARG);
      CHECK(xpack_cache_acquire_blocking(c, 0, ids, 3, 1, s, bad, &t) == XPACK_E_INVALID_ARG);
      CHECK(xpack_cache_entry(c, 1, 0, s, bad) == XPACK_E_INVALID_ARG);
    }
    CHECK(all_canary(reinterpret_cast<const uint8_t*>(s), sizeof s));
    // Refused before anything was acquired: no request was counted.
    xpack_cache_counters k{};
    k.size = sizeof(k);
    REQUIRE(xpack_cache_get_counters(c, &k) == 0);
    CHECK(k.acquires == 0);
  }
  xpack_cache_destroy(c);
}

TEST_CASE("cache: layer counters as a sized struct") {
  Env env;
  xpack_cache* c = env.cache(4);
  const uint32_t ids[2] = {1, 3};
  xpack_expert_slot s[2];
  uint64_t t = 0;
  REQUIRE(xpack_cache_acquire_blocking(c, 2, ids, 2, 5, s, sizeof s[0], &t) == 0);
  REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  REQUIRE(xpack_cache_acquire_blocking(c, 2, ids, 2, 1, s, sizeof s[0], &t) == 0);
  REQUIRE(xpack_cache_release(c, t, nullptr) == 0);

  SUBCASE("the full struct round trips") {
    xpack_layer_counters k{};
    k.size = sizeof(k);
    REQUIRE(xpack_cache_get_layer_counters(c, 2, &k) == 0);
    CHECK(k.size == sizeof(k));
    CHECK(k.route_calls == 2);
    CHECK(k.route_tokens == 6);
    CHECK(k.misses == 2);
    CHECK(k.hits == 2);
    xpack_layer_counters other{};
    other.size = sizeof(other);
    REQUIRE(xpack_cache_get_layer_counters(c, 0, &other) == 0);
    CHECK(other.route_calls == 0);
    CHECK(other.misses == 0);
  }
  SUBCASE("an older, smaller struct: fields beyond its size untouched") {
    xpack_layer_counters k;
    std::memset(&k, kCanary, sizeof k);
    k.size = offsetof(xpack_layer_counters, hits);  // a version without hits and misses
    REQUIRE(xpack_cache_get_layer_counters(c, 2, &k) == 0);
    CHECK(k.size == offsetof(xpack_layer_counters, hits));
    CHECK(k.route_calls == 2);
    CHECK(k.route_tokens == 6);
    CHECK(all_canary(reinterpret_cast<const uint8_t*>(&k.hits), sizeof k.hits + sizeof k.misses));
  }
  SUBCASE("a newer, larger struct: its extra field kept, size says what was written") {
    struct Newer {
      xpack_layer_counters k;
      uint64_t future;
    } n;
    std::memset(&n, kCanary, sizeof n);
    n.k.size = sizeof n;
    REQUIRE(xpack_cache_get_layer_counters(c, 2, &n.k) == 0);
    CHECK(n.k.size == sizeof(xpack_layer_counters));
    CHECK(n.k.misses == 2);
    CHECK(all_canary(reinterpret_cast<const uint8_t*>(&n.future), sizeof n.future));
  }
  SUBCASE("zero, too small, NULL and a layer out of range are refused") {
    xpack_layer_counters k;
    std::memset(&k, kCanary, sizeof k);
    for (size_t bad : {size_t(0), size_t(4)}) {
      k.size = bad;
      CHECK(xpack_cache_get_layer_counters(c, 2, &k) == XPACK_E_INVALID_ARG);
      CHECK(k.size == bad);
      CHECK(all_canary(reinterpret_cast<const uint8_t*>(&k.route_calls), 32));
    }
    CHECK(xpack_cache_get_layer_counters(c, 2, nullptr) == XPACK_E_INVALID_ARG);
    k.size = sizeof k;
    CHECK(xpack_cache_get_layer_counters(c, env.info.n_layers, &k) == XPACK_E_INVALID_ARG);
    CHECK(std::string(xpack_cache_errmsg(c)).find("out of range") != std::string::npos);
    CHECK(xpack_cache_get_layer_counters(nullptr, 0, &k) == XPACK_E_INVALID_ARG);
  }
  xpack_cache_destroy(c);
}

TEST_CASE("engine: submit and reap stride by the caller's element size") {
  Env env;
  xpack_engine_options o;
  REQUIRE(xpack_engine_options_init(&o) == 0);
  o.slots = 4;
  o.direct_io = XPACK_IO_BUFFERED;  // tmpfs may refuse O_DIRECT; the strides are what is tested
  xpack_engine* e = nullptr;
  REQUIRE_MESSAGE(xpack_engine_create(env.pack, &o, &e) == 0, xpack_last_error());
  std::vector<uint8_t> want(env.info.object_bytes);

  // A newer caller's request: an extra field the library does not know.
  struct NewerRequest {
    xpack_read_request r;
    uint32_t future;
    uint64_t more;
  };
  NewerRequest reqs[2];
  std::memset(reqs, kCanary, sizeof reqs);
  reqs[0].r = {1, 6, 0};
  reqs[1].r = {2, 3, 3};
  REQUIRE_MESSAGE(xpack_engine_submit(e, &reqs[0].r, 2, sizeof(NewerRequest)) == 0, xpack_engine_errmsg(e));

  // Completions at exactly the first version's size, then a canary.
  const size_t v1 = XPACK_READ_COMPLETION_SIZE_V1;
  std::vector<uint8_t> buf(4 * v1 + 16, kCanary);
  int got = 0;
  while (got < 2) {
    int n = xpack_engine_reap(e, reinterpret_cast<xpack_read_completion*>(buf.data() + size_t(got) * v1),
                              size_t(2 - got), v1, 5000);
    REQUIRE_MESSAGE(n > 0, xpack_engine_errmsg(e));
    got += n;
  }
  CHECK(all_canary(buf.data() + 2 * v1, 2 * v1 + 16));
  for (int i = 0; i < 2; ++i) {
    const auto slot = field_at<uint32_t>(buf, size_t(i), v1, offsetof(xpack_read_completion, slot));
    const auto layer = field_at<uint32_t>(buf, size_t(i), v1, offsetof(xpack_read_completion, layer_slot));
    const auto expert = field_at<uint32_t>(buf, size_t(i), v1, offsetof(xpack_read_completion, expert));
    CHECK(field_at<int32_t>(buf, size_t(i), v1, offsetof(xpack_read_completion, status)) == 0);
    CHECK(((slot == 0 && layer == 1 && expert == 6) || (slot == 3 && layer == 2 && expert == 3)));
    const void* data = nullptr;
    size_t bytes = 0;
    REQUIRE(xpack_engine_slot_data(e, slot, &data, &bytes) == 0);
    REQUIRE(xpack_pack_read_object(env.pack, layer, expert, want.data(), want.size(), 1) == 0);
    CHECK(std::memcmp(data, want.data(), bytes) == 0);
  }

  // Reap into a newer caller's larger element: the extra bytes stay as they were.
  xpack_read_request again{0, 0, 1};
  REQUIRE(xpack_engine_submit(e, &again, 1, XPACK_READ_REQUEST_SIZE_V1) == 0);
  struct NewerCompletion {
    xpack_read_completion c;
    uint64_t future;
  } nc;
  std::memset(&nc, kCanary, sizeof nc);
  REQUIRE(xpack_engine_reap(e, &nc.c, 1, sizeof nc, 5000) == 1);
  CHECK(nc.c.slot == 1);
  CHECK(nc.c.status == 0);
  CHECK(all_canary(reinterpret_cast<const uint8_t*>(&nc.future), sizeof nc.future));

  // Zero and too-small sizes: refused with a message, nothing submitted or written.
  xpack_read_request r{0, 1, 2};
  xpack_read_completion c[2];
  std::memset(c, kCanary, sizeof c);
  for (size_t bad : {size_t(0), size_t(8), XPACK_READ_REQUEST_SIZE_V1 - 1}) {
    CAPTURE(bad);
    CHECK(xpack_engine_submit(e, &r, 1, bad) == XPACK_E_INVALID_ARG);
    CHECK(std::string(xpack_engine_errmsg(e)).find("xpack_read_request") != std::string::npos);
  }
  for (size_t bad : {size_t(0), v1 - 1}) {
    CAPTURE(bad);
    CHECK(xpack_engine_reap(e, c, 2, bad, 0) == XPACK_E_INVALID_ARG);
    CHECK(std::string(xpack_engine_errmsg(e)).find("xpack_read_completion") != std::string::npos);
  }
  CHECK(all_canary(reinterpret_cast<const uint8_t*>(c), sizeof c));
  // The refused submit left slot 2 idle: it can be used now.
  REQUIRE(xpack_engine_submit(e, &r, 1, sizeof r) == 0);
  REQUIRE(xpack_engine_reap(e, c, 2, sizeof c[0], 5000) == 1);
  CHECK(c[0].slot == 2);
  xpack_engine_destroy(e);
}

TEST_CASE("pack: older info structs are filled only as far as their size") {
  Env env;
  xpack_pack_info i;
  std::memset(&i, kCanary, sizeof i);
  i.size = offsetof(xpack_pack_info, n_experts);
  REQUIRE(xpack_pack_get_info(env.pack, &i) == 0);
  CHECK(i.size == offsetof(xpack_pack_info, n_experts));
  CHECK(i.n_layers == env.info.n_layers);
  CHECK(all_canary(reinterpret_cast<const uint8_t*>(&i.n_experts), sizeof i.n_experts));
  CHECK(all_canary(i.source_sha256, sizeof i.source_sha256));
  xpack_role_info r;
  std::memset(&r, kCanary, sizeof r);
  r.size = offsetof(xpack_role_info, offset);
  REQUIRE(xpack_pack_role_info(env.pack, 0, &r) == 0);
  CHECK(r.n_dims >= 1);
  CHECK(all_canary(reinterpret_cast<const uint8_t*>(&r.offset), sizeof r.offset + sizeof r.nbytes));
  r.size = 0;
  CHECK(xpack_pack_role_info(env.pack, 0, &r) == XPACK_E_INVALID_ARG);
}
