// The xpack_cache_* C API on a real Expert Pack (xpack-synth -> pack builder),
// host device backend: every slot byte-exact against xpack_pack_read_object,
// options, errors, counters, fault injection through the engine's default plan.
#include <doctest/doctest.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "cache/policy.h"
#include "fixtures.h"
#include "io/fault_injection.h"
#include "pack/builder.h"
#include "xpack/xpack.h"

using namespace xpack;
using xpack::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string make_pack(const TempDir& dir, uint32_t layers, uint32_t experts) {
  auto synth = xpack::test::build_dir() / "tools" / "xpack-synth";
  if (!fs::exists(synth)) FAIL("xpack-synth is not built at " << synth.string());
  auto gguf = dir / "deepseek4.gguf";
  std::string out;
  int rc = xpack::test::run_command(synth.string() + " --arch deepseek4 --layers " +
                                        std::to_string(layers) + " --experts " +
                                        std::to_string(experts) + " --top-k 2 -q -o " +
                                        gguf.string(),
                                    &out);
  REQUIRE_MESSAGE(rc == 0, out);
  pack::BuildOptions bo;
  bo.source = gguf.string();
  bo.out = (dir / "deepseek4").string();
  auto rep = pack::build_pack(bo);
  REQUIRE_MESSAGE(rep.ok(), (rep.ok() ? "" : rep.error().message));
  return rep->pack_path;
}

struct Env {
  TempDir dir;
  xpack_pack* pack = nullptr;
  xpack_pack_info info{};
  Env(uint32_t layers = 3, uint32_t experts = 8) {
    auto path = make_pack(dir, layers, experts);
    REQUIRE_MESSAGE(xpack_pack_open(path.c_str(), nullptr, &pack) == 0, xpack_last_error());
    info.size = sizeof(info);
    REQUIRE(xpack_pack_get_info(pack, &info) == 0);
  }
  ~Env() { xpack_pack_close(pack); }
  xpack_cache_options opts(uint32_t slots) const {
    xpack_cache_options o;
    REQUIRE(xpack_cache_options_init(&o) == 0);
    o.device = XPACK_DEVICE_HOST;
    o.budget_bytes = slots * ((info.object_bytes + 255) / 256 * 256);
    return o;
  }
};

void check_against_pack(xpack_cache* c, xpack_pack* p, uint32_t layer, const xpack_expert_slot& s,
                        uint64_t object_bytes) {
  std::vector<uint8_t> want(object_bytes), got(object_bytes);
  REQUIRE(xpack_pack_read_object(p, layer, s.expert, want.data(), want.size(), 1) == 0);
  REQUIRE(xpack_cache_read_slot(c, s.slot, got.data(), got.size()) == 0);
  CHECK_MESSAGE(got == want, "layer " << layer << " expert " << s.expert);
}

}  // namespace

TEST_CASE("C API: every object delivered byte-exact, counters and info") {
  Env env;
  auto o = env.opts(5);
  o.verify = 1;
  o.read_splits = 3;
  xpack_cache* c = nullptr;
  REQUIRE_MESSAGE(xpack_cache_create(env.pack, &o, &c) == 0, xpack_last_error());
  xpack_cache_info info{};
  info.size = sizeof(info);
  REQUIRE(xpack_cache_get_info(c, &info) == 0);
  CHECK(info.slot_count == 5);
  CHECK(std::string(info.device_backend) == "host");
  CHECK(std::string(info.policy) == "adaptive");  // the default
  CHECK(info.object_bytes == env.info.object_bytes);
  for (uint32_t l = 0; l < env.info.n_layers; ++l)
    for (uint32_t e = 0; e < env.info.n_experts; e += 2) {
      uint32_t ids[2] = {e + 1, e};
      xpack_expert_slot s[2];
      uint64_t t = 0;
      REQUIRE(xpack_cache_acquire_blocking(c, l, ids, 2, 1, s, sizeof(xpack_expert_slot), &t) == 0);
      CHECK(s[0].expert == e + 1);
      CHECK(s[0].ready_event == nullptr);
      for (auto& x : s) check_against_pack(c, env.pack, l, x, env.info.object_bytes);
      void* ptr = nullptr;
      REQUIRE(xpack_cache_slot_pointer(c, s[1].slot, &ptr) == 0);
      CHECK(ptr == s[1].data);
      REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
    }
  xpack_cache_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_cache_get_counters(c, &k) == 0);
  // The staging memory's page size is measured (4 KiB for this small arena, or
  // 2 MiB where THP "always" backs it anyway), never left unknown.
  CHECK((k.staging_page_bytes == 4096 || k.staging_page_bytes == (2u << 20)));
  CHECK(k.staging_huge_fraction >= 0.0);
  CHECK(k.staging_huge_fraction <= 1.0);
  uint64_t n = uint64_t(env.info.n_layers) * env.info.n_experts;
  CHECK(k.cache_misses == n);
  CHECK(k.cache_hits == 0);
  CHECK(k.pack_reads == n);
  CHECK(k.h2d_bytes == n * env.info.object_bytes);
  CHECK(k.cache_evictions == n - 5);
  CHECK(k.io_errors == 0);
  CHECK(k.n_layers == env.info.n_layers);
  xpack_layer_counters lk{};
  lk.size = sizeof(lk);
  lk.hits = 9;
  REQUIRE(xpack_cache_get_layer_counters(c, 1, &lk) == 0);
  CHECK(lk.route_calls == env.info.n_experts / 2);
  CHECK(lk.route_tokens == env.info.n_experts / 2);
  CHECK(lk.hits == 0);
  CHECK(lk.misses == env.info.n_experts);
  CHECK(xpack_cache_get_layer_counters(c, 99, &lk) == XPACK_E_INVALID_ARG);
  xpack_cache_destroy(c);
}

TEST_CASE("C API: argument errors, capacity, NULL handling") {
  Env env;
  xpack_cache_destroy(nullptr);
  xpack_cache* c = nullptr;
  CHECK(xpack_cache_create(nullptr, nullptr, &c) == XPACK_E_INVALID_ARG);
  CHECK(c == nullptr);
  CHECK(xpack_cache_options_init(nullptr) == XPACK_E_INVALID_ARG);
  auto o = env.opts(1);  // top-k is 2
  CHECK(xpack_cache_create(env.pack, &o, &c) == XPACK_E_CAPACITY);
  CHECK(std::string(xpack_last_error()).find("top-k") != std::string::npos);
  o = env.opts(4);
  o.policy = 7;
  CHECK(xpack_cache_create(env.pack, &o, &c) == XPACK_E_INVALID_ARG);
  o = env.opts(4);
  o.size = 0;
  CHECK(xpack_cache_create(env.pack, &o, &c) == XPACK_E_INVALID_ARG);
#ifndef XPACK_HAVE_CUDA
  o = env.opts(4);
  o.device = XPACK_DEVICE_CUDA;
  CHECK(xpack_cache_create(env.pack, &o, &c) == XPACK_E_UNSUPPORTED);
#endif
  o = env.opts(4);
  o.policy = XPACK_POLICY_LRU;
  o.size = offsetof(xpack_cache_options, staging_slots);  // old, shorter struct
  REQUIRE(xpack_cache_create(env.pack, &o, &c) == 0);
  uint32_t bad = env.info.n_experts;
  xpack_expert_slot s[4];
  uint64_t t = 0;
  CHECK(xpack_cache_acquire(c, 0, &bad, 1, 1, s, sizeof(xpack_expert_slot), &t) == XPACK_E_INVALID_ARG);
  CHECK(std::string(xpack_cache_errmsg(c)).find("out of range") != std::string::npos);
  CHECK(xpack_cache_acquire(c, 0, &bad, 1, 1, nullptr, sizeof(xpack_expert_slot), &t) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_release(c, 777, nullptr) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_wait(c, 777, 0) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_read_slot(c, 99, s, sizeof(s)) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_acquire(nullptr, 0, &bad, 1, 1, s, sizeof(xpack_expert_slot), &t) == XPACK_E_INVALID_ARG);
  xpack_cache_counters k{};
  CHECK(xpack_cache_get_counters(c, &k) == XPACK_E_INVALID_ARG);  // size not set
  uint32_t ids[4] = {0, 1, 2, 3};
  REQUIRE(xpack_cache_acquire(c, 0, ids, 4, 4, s, sizeof(xpack_expert_slot), &t) == 0);
  uint64_t t2 = 0;
  uint32_t other = 4;
  CHECK(xpack_cache_acquire(c, 0, &other, 1, 1, s, sizeof(xpack_expert_slot), &t2) == XPACK_E_CAPACITY);  // all held
  CHECK(xpack_cache_prefetch(c, 0, &other, 1) == 0);  // nothing evictable
  REQUIRE(xpack_cache_wait_all(c, t) == 0);
  REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  CHECK(xpack_cache_prefetch(c, 0, &other, 1) == 1);
  uint32_t fifth = 5;
  CHECK(xpack_cache_prefetch_ex(c, 0, &fifth, 1, 2u) == XPACK_E_INVALID_ARG);
  CHECK(std::string(xpack_cache_errmsg(c)).find("unknown prefetch flags 2") != std::string::npos);
  CHECK(xpack_cache_prefetch_ex(nullptr, 0, &fifth, 1, XPACK_PREFETCH_CERTAIN) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_prefetch_ex(c, 0, &bad, 1, XPACK_PREFETCH_CERTAIN) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_prefetch_ex(c, 0, &fifth, 1, XPACK_PREFETCH_CERTAIN) == 1);
  xpack_cache_destroy(c);
}

TEST_CASE("C API: by default every object is checked, so a damaged one never reaches a slot") {
  Env env;
  // One byte of (layer 1, expert 3) flipped on disk, after the pack was opened.
  uint64_t off = 0;
  REQUIRE(xpack_pack_object_offset(env.pack, 1, 3, &off) == 0);
  {
    auto bytes = xpack::test::read_file(xpack_pack_path(env.pack));
    bytes[off + 100] ^= 0x40;
    xpack::test::write_file(xpack_pack_path(env.pack), bytes);
  }
  auto run = [&](int32_t verify, int want_rc) {
    xpack_cache_options o{};  // zero-filled: the defaults
    o.size = sizeof(o);
    o.device = XPACK_DEVICE_HOST;
    o.budget_bytes = env.opts(4).budget_bytes;
    o.verify = verify;
    xpack_cache* c = nullptr;
    REQUIRE_MESSAGE(xpack_cache_create(env.pack, &o, &c) == 0, xpack_last_error());
    uint32_t ids[2] = {3, 4};
    xpack_expert_slot s[2];
    uint64_t t = 0;
    REQUIRE(xpack_cache_acquire(c, 1, ids, 2, 1, s, sizeof(xpack_expert_slot), &t) == 0);
    CHECK(xpack_cache_wait(c, t, 0) == want_rc);
    CHECK(xpack_cache_wait(c, t, 1) == 0);
    if (want_rc != 0) CHECK(std::string(xpack_cache_errmsg(c)).find("expert 3") != std::string::npos);
    REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
    xpack_cache_destroy(c);
  };
  run(0, XPACK_E_OBJECT_CHECKSUM);               // zero: XPACK_VERIFY_ON
  run(XPACK_VERIFY_ON, XPACK_E_OBJECT_CHECKSUM);
  run(1, XPACK_E_OBJECT_CHECKSUM);               // the old explicit "on"
  run(XPACK_VERIFY_OFF, 0);                      // the opt-out delivers what is on disk
  xpack_cache_options o{};
  o.size = sizeof(o);
  o.device = XPACK_DEVICE_HOST;
  o.verify = 7;
  xpack_cache* c = nullptr;
  CHECK(xpack_cache_create(env.pack, &o, &c) == XPACK_E_INVALID_ARG);
  CHECK(c == nullptr);
}

TEST_CASE("C API: an injected EIO fails one expert; stats file written at destroy") {
  Env env;
  io::FaultPlan plan;
  plan.completions.push_back({cache::make_key(1, 3), -1, EIO, 0, 1});
  io::set_default_fault_plan(&plan);
  auto o = env.opts(4);
  auto stats = (env.dir / "stats.json").string();
  auto trace = (env.dir / "trace.csv").string();
  o.stats_path = stats.c_str();
  o.trace_path = trace.c_str();
  xpack_cache* c = nullptr;
  REQUIRE_MESSAGE(xpack_cache_create(env.pack, &o, &c) == 0, xpack_last_error());
  uint32_t ids[2] = {3, 4};
  xpack_expert_slot s[2];
  uint64_t t = 0;
  REQUIRE(xpack_cache_acquire(c, 1, ids, 2, 1, s, sizeof(xpack_expert_slot), &t) == 0);
  CHECK(xpack_cache_wait(c, t, 0) == -EIO);
  CHECK(std::string(xpack_cache_errmsg(c)).find("expert 3") != std::string::npos);
  CHECK(xpack_cache_wait(c, t, 1) == 0);
  check_against_pack(c, env.pack, 1, s[1], env.info.object_bytes);
  REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  xpack_cache_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_cache_get_counters(c, &k) == 0);
  CHECK(k.io_errors == 1);
  // Usable after: the expert loads fine now (the fault fired once).
  REQUIRE(xpack_cache_acquire_blocking(c, 1, ids, 1, 1, s, sizeof(xpack_expert_slot), &t) == 0);
  check_against_pack(c, env.pack, 1, s[0], env.info.object_bytes);
  REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  xpack_cache_destroy(c);
  io::set_default_fault_plan(nullptr);
  CHECK(fs::exists(stats));
  auto text = xpack::test::read_file(stats);
  std::string j(text.begin(), text.end());
  CHECK(j.find("\"io_errors\": 1") != std::string::npos);
  auto tr = xpack::test::read_file(trace);
  CHECK(std::string(tr.begin(), tr.end()) == "step,layer,expert\n0,1,3\n0,1,4\n1,1,3\n");
}

TEST_CASE("C API: XPACK_ACQUIRE_DEFER streams a layer wider than the cache, byte-exact") {
  Env env(2, 8);
  auto o = env.opts(3);
  xpack_cache* c = nullptr;
  REQUIRE(xpack_cache_create(env.pack, &o, &c) == 0);
  uint32_t ids[8] = {7, 6, 5, 4, 3, 2, 1, 0};  // the whole layer through 3 slots
  xpack_expert_slot s[8];
  uint64_t t = 0;
  CHECK(xpack_cache_acquire_ex(c, 1, ids, 8, 8, 0, s, sizeof(xpack_expert_slot), &t) == XPACK_E_CAPACITY);
  CHECK(xpack_cache_acquire_ex(c, 1, ids, 8, 8, 0x80, s, sizeof(xpack_expert_slot), &t) == XPACK_E_INVALID_ARG);
  REQUIRE(xpack_cache_acquire_ex(c, 1, ids, 8, 8, XPACK_ACQUIRE_DEFER, s, sizeof(xpack_expert_slot), &t) == 0);
  CHECK(s[2].slot != XPACK_SLOT_DEFERRED);
  CHECK(s[3].slot == XPACK_SLOT_DEFERRED);
  CHECK(s[3].data == nullptr);
  CHECK(xpack_cache_wait(c, t, 3) == XPACK_E_CAPACITY);  // only this ticket could make room
  for (size_t i = 0; i < 8; ++i) {
    REQUIRE(xpack_cache_wait(c, t, i) == 0);
    xpack_expert_slot e{};
    REQUIRE(xpack_cache_entry(c, t, i, &e, sizeof(xpack_expert_slot)) == 0);
    REQUIRE(e.slot != XPACK_SLOT_DEFERRED);
    CHECK(e.expert == ids[i]);
    check_against_pack(c, env.pack, 1, e, env.info.object_bytes);
    REQUIRE(xpack_cache_release_expert(c, t, i, nullptr) == 0);
  }
  CHECK(xpack_cache_release_expert(c, t, 0, nullptr) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_entry(c, t, 8, s, sizeof(xpack_expert_slot)) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_entry(c, t, 0, nullptr, sizeof(xpack_expert_slot)) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_entry(nullptr, t, 0, s, sizeof(xpack_expert_slot)) == XPACK_E_INVALID_ARG);
  CHECK(xpack_cache_release_expert(nullptr, t, 0, nullptr) == XPACK_E_INVALID_ARG);
  REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
  xpack_cache_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_cache_get_counters(c, &k) == 0);
  CHECK(k.cache_misses == 8);
  CHECK(k.pack_reads == 8);
  xpack_cache_destroy(c);
}

TEST_CASE("C API: a host tier behind the slots serves evicted experts without a read") {
  Env env(2, 8);
  auto o = env.opts(2);
  o.policy = XPACK_POLICY_LRU;
  const uint64_t frame = (env.info.object_bytes + 4095) / 4096 * 4096;
  o.host_cache_bytes = 2 * frame - 1;  // fewer than two frames: refused, said why
  xpack_cache* c = nullptr;
  CHECK(xpack_cache_create(env.pack, &o, &c) == XPACK_E_INVALID_ARG);
  CHECK(c == nullptr);
  CHECK(std::string(xpack_last_error()).find("host tier") != std::string::npos);
  o.host_cache_bytes = 5 * frame;  // 4 held + the spare
  REQUIRE_MESSAGE(xpack_cache_create(env.pack, &o, &c) == 0, xpack_last_error());
  xpack_cache_info info{};
  info.size = sizeof(info);
  REQUIRE(xpack_cache_get_info(c, &info) == 0);
  CHECK(info.host_frames == 5);
  CHECK(info.host_frame_stride == frame);
  // Layer 0's experts 0..5 one at a time, twice: the second pass finds 0..3 in
  // the tier (2 slots + 4 held = the 6 most recent), byte-exact.
  for (int pass = 0; pass < 2; ++pass)
    for (uint32_t e = 0; e < 6; ++e) {
      xpack_expert_slot s{};
      uint64_t t = 0;
      REQUIRE(xpack_cache_acquire_blocking(c, 0, &e, 1, 1, &s, sizeof s, &t) == 0);
      check_against_pack(c, env.pack, 0, s, env.info.object_bytes);
      REQUIRE(xpack_cache_release(c, t, nullptr) == 0);
    }
  xpack_cache_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_cache_get_counters(c, &k) == 0);
  CHECK(k.cache_misses == 12);
  CHECK(k.host_hits == 6);
  CHECK(k.pack_reads == 6);
  CHECK(k.host_demotions == 10);
  CHECK(k.d2h_bytes == 10 * env.info.object_bytes);
  CHECK(k.host_evictions == 0);
  CHECK(k.ssd_busy_ns > 0);
  // An older caller's counters struct (without the tier's fields) is still served.
  xpack_cache_counters old{};
  old.size = offsetof(xpack_cache_counters, host_hits);
  old.host_hits = 777;
  REQUIRE(xpack_cache_get_counters(c, &old) == 0);
  CHECK(old.cache_misses == 12);
  CHECK(old.host_hits == 777);
  xpack_cache_destroy(c);
}
