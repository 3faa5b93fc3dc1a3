// The engine on real Expert Packs (xpack-synth -> pack builder) through the C API:
// every object byte-exact against xpack_pack_read_object, counters, errors, and
// the failure paths (io_uring refused, no O_DIRECT, EIO, truncated pack).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <unistd.h>

#include <fmt/format.h>

#include "io/fault_injection.h"
#include "io/pack_reads.h"
#include "pack/builder.h"
#include "xpack/xpack.h"
#include "fixtures.h"

using namespace xpack;
using xpack::test::TempDir;
namespace fs = std::filesystem;

namespace {

// Builds a small synthetic MoE pack (deepseek4 layout: MXFP4 experts, payload not
// a multiple of 4096, so reads cover part of the stride padding).
std::string make_pack(const TempDir& dir, const std::string& arch, uint32_t layers,
                      uint32_t experts) {
  auto synth = xpack::test::build_dir() / "tools" / "xpack-synth";
  if (!fs::exists(synth)) FAIL("xpack-synth is not built at " << synth.string());
  auto gguf = dir / (arch + ".gguf");
  std::string out;
  int rc = xpack::test::run_command(
      synth.string() + " --arch " + arch + " --layers " + std::to_string(layers) +
          " --experts " + std::to_string(experts) + " --top-k 2 -q -o " + gguf.string(),
      &out);
  REQUIRE_MESSAGE(rc == 0, out);
  pack::BuildOptions bo;
  bo.source = gguf.string();
  bo.out = (dir / arch).string();
  auto rep = pack::build_pack(bo);
  REQUIRE_MESSAGE(rep.ok(), (rep.ok() ? "" : rep.error().message));
  return rep->pack_path;
}

struct PackHandle {
  xpack_pack* p = nullptr;
  explicit PackHandle(const std::string& path) {
    int rc = xpack_pack_open(path.c_str(), nullptr, &p);
    REQUIRE_MESSAGE(rc == 0, xpack_last_error());
  }
  ~PackHandle() { xpack_pack_close(p); }
};

xpack_pack_info info_of(xpack_pack* p) {
  xpack_pack_info info{};
  info.size = sizeof(info);
  REQUIRE(xpack_pack_get_info(p, &info) == 0);
  return info;
}

std::vector<xpack_read_completion> reap_n(xpack_engine* e, size_t n) {
  std::vector<xpack_read_completion> all;
  xpack_read_completion buf[16];
  while (all.size() < n) {
    int got = xpack_engine_reap(e, buf, 16, sizeof(xpack_read_completion), 5000);
    REQUIRE_MESSAGE(got >= 0, xpack_engine_errmsg(e));
    if (got == 0) {
      FAIL("no completion within 5 s");
      break;
    }
    all.insert(all.end(), buf, buf + got);
  }
  return all;
}

// Reads every object through `slots` slots in random order and compares each
// with the pack's own synchronous read (checksum-verified).
void read_every_object(xpack_pack* p, const xpack_engine_options& o, uint32_t seed) {
  auto info = info_of(p);
  xpack_engine* e = nullptr;
  REQUIRE_MESSAGE(xpack_engine_create(p, &o, &e) == 0, xpack_last_error());
  std::vector<std::pair<uint32_t, uint32_t>> objs;
  for (uint32_t l = 0; l < info.n_layers; ++l)
    for (uint32_t x = 0; x < info.n_experts; ++x) objs.push_back({l, x});
  std::mt19937 rng(seed);
  std::shuffle(objs.begin(), objs.end(), rng);
  std::vector<uint8_t> expect(info.object_bytes);
  std::vector<uint32_t> free_slots;
  for (uint32_t s = 0; s < o.slots; ++s) free_slots.push_back(s);
  size_t next = 0, done = 0;
  while (done < objs.size()) {
    std::vector<xpack_read_request> batch;
    while (!free_slots.empty() && next < objs.size()) {
      batch.push_back({objs[next].first, objs[next].second, free_slots.back()});
      free_slots.pop_back();
      ++next;
    }
    if (!batch.empty()) REQUIRE(xpack_engine_submit(e, batch.data(), batch.size(), sizeof(xpack_read_request)) == 0);
    xpack_read_completion c[8];
    int got = xpack_engine_reap(e, c, 8, sizeof(xpack_read_completion), 5000);
    REQUIRE(got > 0);
    for (int i = 0; i < got; ++i) {
      REQUIRE(c[i].status == 0);
      const void* data = nullptr;
      size_t bytes = 0;
      REQUIRE(xpack_engine_slot_data(e, c[i].slot, &data, &bytes) == 0);
      CHECK(bytes == info.object_bytes);
      REQUIRE(xpack_pack_read_object(p, c[i].layer_slot, c[i].expert, expect.data(),
                                     expect.size(), 1) == 0);
      CHECK(std::memcmp(data, expect.data(), expect.size()) == 0);
      free_slots.push_back(c[i].slot);
      ++done;
    }
  }
  xpack_engine_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.objects_completed == objs.size());
  CHECK(k.io_errors == 0);
  CHECK(k.fallback_count == 0);
  CHECK(k.read_bytes == objs.size() * ((info.object_bytes + 4095) / 4096 * 4096));
  CHECK(k.lat_p50_ns > 0);
  CHECK(k.lat_p50_ns <= k.lat_p99_ns);
  CHECK(k.ring_flags != 0);
  CHECK((k.staging_page_bytes == 4096 || k.staging_page_bytes == (2u << 20)));  // measured
  CHECK(k.staging_huge_fraction >= 0.0);
  CHECK(k.staging_huge_fraction <= 1.0);
  uint64_t hist_total = 0;
  for (auto v : k.lat_log2_ns) hist_total += v;
  CHECK(hist_total == objs.size());
  xpack_engine_destroy(e);
}

xpack_engine_options defaults() {
  xpack_engine_options o;
  REQUIRE(xpack_engine_options_init(&o) == 0);
  return o;
}

}  // namespace

TEST_CASE("every pack object lands byte-exact: splits 1..4, depth 1 and 64") {
  TempDir dir;
  std::string path = make_pack(dir, "deepseek4", 3, 8);
  PackHandle ph(path);
  auto info = info_of(ph.p);
  MESSAGE("pack: " << info.n_layers << " x " << info.n_experts << " objects of "
                   << info.object_bytes << " bytes, stride " << info.object_stride);
  for (uint32_t splits : {1u, 2u, 4u}) {
    for (uint32_t depth : {1u, 64u}) {
      CAPTURE(splits);
      CAPTURE(depth);
      auto o = defaults();
      o.slots = 5;
      o.queue_depth = depth;
      o.read_splits = splits;
      read_every_object(ph.p, o, splits + depth);
    }
  }
}

TEST_CASE("a second architecture (kimi-k3 roles) reads byte-exact") {
  TempDir dir;
  std::string path = make_pack(dir, "kimi-k3", 3, 8);
  PackHandle ph(path);
  auto o = defaults();
  o.slots = 3;
  o.read_splits = 3;
  read_every_object(ph.p, o, 9);
}

TEST_CASE("C API argument errors") {
  TempDir dir;
  std::string path = make_pack(dir, "deepseek4", 2, 4);
  PackHandle ph(path);
  xpack_engine_destroy(nullptr);
  CHECK(std::string(xpack_engine_errmsg(nullptr)).empty());
  xpack_engine* e = reinterpret_cast<xpack_engine*>(0x1);
  CHECK(xpack_engine_create(nullptr, nullptr, &e) == XPACK_E_INVALID_ARG);
  CHECK(e == nullptr);
  CHECK(std::string(xpack_last_error()).size() > 0);
  xpack_engine_options bad{};
  bad.size = 0;
  CHECK(xpack_engine_create(ph.p, &bad, &e) == XPACK_E_INVALID_ARG);
  auto o = defaults();
  o.queue_depth = 100000;
  CHECK(xpack_engine_create(ph.p, &o, &e) == XPACK_E_INVALID_ARG);

  // An old caller's struct (only size + slots) gets defaults for the rest; the
  // fields past its size must not be read (they are garbage here).
  struct OldOptions { size_t size; uint32_t slots; uint32_t garbage[8]; } old;
  std::memset(&old, 0xAB, sizeof(old));
  old.size = offsetof(OldOptions, slots) + sizeof(uint32_t);
  old.slots = 2;
  REQUIRE(xpack_engine_create(ph.p, reinterpret_cast<xpack_engine_options*>(&old), &e) == 0);
  xpack_read_request r{0, 99, 0};  // no expert 99
  CHECK(xpack_engine_submit(e, &r, 1, sizeof(xpack_read_request)) == XPACK_E_INVALID_ARG);
  CHECK(std::string(xpack_engine_errmsg(e)).find("expert 99") != std::string::npos);
  r = {0, 0, 2};  // slot out of range (2 slots)
  CHECK(xpack_engine_submit(e, &r, 1, sizeof(xpack_read_request)) == XPACK_E_INVALID_ARG);
  const void* data = nullptr;
  CHECK(xpack_engine_slot_data(e, 0, &data, nullptr) == XPACK_E_INVALID_ARG);  // never read
  CHECK(data == nullptr);
  CHECK(xpack_engine_slot_data(e, 7, &data, nullptr) == XPACK_E_INVALID_ARG);
  CHECK(xpack_engine_submit(e, nullptr, 1, sizeof(xpack_read_request)) == XPACK_E_INVALID_ARG);
  CHECK(xpack_engine_submit(e, nullptr, 0, sizeof(xpack_read_request)) == 0);
  CHECK(xpack_engine_reap(e, nullptr, 4, sizeof(xpack_read_completion), 0) == XPACK_E_INVALID_ARG);
  xpack_read_completion c[2];
  CHECK(xpack_engine_reap(e, c, 2, sizeof(xpack_read_completion), 0) == 0);
  CHECK(xpack_engine_reap(e, c, 2, sizeof(xpack_read_completion), -1) == 0);  // nothing in flight: no blocking
  xpack_engine_counters k{};
  CHECK(xpack_engine_get_counters(e, &k) == XPACK_E_INVALID_ARG);  // size not set
  k.size = sizeof(size_t) + sizeof(uint64_t);  // an older, shorter struct
  CHECK(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.size == sizeof(size_t) + sizeof(uint64_t));
  xpack_engine_destroy(e);
}

TEST_CASE("C API failure paths through the fault hook") {
  TempDir dir;
  std::string path = make_pack(dir, "deepseek4", 2, 4);
  PackHandle ph(path);
  auto o = defaults();
  xpack_engine* e = nullptr;

  io::FaultPlan refused;
  refused.ring_setup_errno = EPERM;
  io::set_default_fault_plan(&refused);
  CHECK(xpack_engine_create(ph.p, &o, &e) == XPACK_E_URING);
  CHECK(e == nullptr);
  CHECK(std::string(xpack_last_error()).find("io_uring") != std::string::npos);

  io::FaultPlan no_direct;
  no_direct.open_direct_errno = EINVAL;
  io::set_default_fault_plan(&no_direct);
  CHECK(xpack_engine_create(ph.p, &o, &e) == XPACK_E_NO_DIRECT_IO);
  CHECK(std::string(xpack_last_error()).find("XPACK_IO_BUFFERED") != std::string::npos);
  auto buffered = o;
  buffered.direct_io = XPACK_IO_BUFFERED;
  REQUIRE(xpack_engine_create(ph.p, &buffered, &e) == 0);
  xpack_read_request r{1, 3, 0};
  REQUIRE(xpack_engine_submit(e, &r, 1, sizeof(xpack_read_request)) == 0);
  auto got = reap_n(e, 1);
  CHECK(got[0].status == 0);
  xpack_engine_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.fallback_count >= 1);
  CHECK(k.fallback_count == k.reads);
  xpack_engine_destroy(e);

  io::FaultPlan eio;
  eio.completions.push_back({io::object_tag(1, 2), -1, EIO, 0, 1});
  io::set_default_fault_plan(&eio);
  REQUIRE(xpack_engine_create(ph.p, &o, &e) == 0);
  io::set_default_fault_plan(nullptr);
  xpack_read_request batch[] = {{1, 2, 0}, {0, 1, 1}};
  REQUIRE(xpack_engine_submit(e, batch, 2, sizeof(xpack_read_request)) == 0);
  got = reap_n(e, 2);
  for (const auto& c : got) {
    const void* data = nullptr;
    if (c.layer_slot == 1 && c.expert == 2) {
      CHECK(c.status == -EIO);
      CHECK(xpack_engine_slot_data(e, c.slot, &data, nullptr) == XPACK_E_INVALID_ARG);
      CHECK(std::string(xpack_engine_errmsg(e)).find("Input/output error") != std::string::npos);
    } else {
      CHECK(c.status == 0);
      CHECK(xpack_engine_slot_data(e, c.slot, &data, nullptr) == 0);
    }
  }
  k = {};
  k.size = sizeof(k);
  REQUIRE(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.io_errors == 1);
  CHECK(k.objects_completed == 1);
  // The engine is still usable: the same object again into the failed slot.
  xpack_read_request again{1, 2, 0};
  REQUIRE(xpack_engine_submit(e, &again, 1, sizeof(xpack_read_request)) == 0);
  got = reap_n(e, 1);
  CHECK(got[0].status == 0);
  xpack_engine_destroy(e);
}

TEST_CASE("a pack truncated under the engine fails the cut objects") {
  TempDir dir;
  std::string path = make_pack(dir, "deepseek4", 2, 4);
  PackHandle ph(path);
  auto info = info_of(ph.p);
  auto o = defaults();
  o.slots = 2;
  xpack_engine* e = nullptr;
  REQUIRE(xpack_engine_create(ph.p, &o, &e) == 0);
  // Cut the file in the middle of the last object (layer 1, expert 3).
  uint64_t last = 0;
  REQUIRE(xpack_pack_object_offset(ph.p, 1, 3, &last) == 0);
  REQUIRE(truncate(path.c_str(), static_cast<off_t>(last + 4096)) == 0);
  xpack_read_request batch[] = {{1, 3, 0}, {0, 0, 1}};
  REQUIRE(xpack_engine_submit(e, batch, 2, sizeof(xpack_read_request)) == 0);
  auto got = reap_n(e, 2);
  for (const auto& c : got) {
    if (c.layer_slot == 1 && c.expert == 3)
      CHECK(c.status == XPACK_E_TRUNCATED);
    else
      CHECK(c.status == 0);
  }
  xpack_engine_counters k{};
  k.size = sizeof(k);
  REQUIRE(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.io_errors == 1);
  if (info.object_bytes > 4096) CHECK(k.short_read_retries >= 1);
  xpack_engine_destroy(e);
}

TEST_CASE("pack geometry checks") {
  io::PackGeometry g{"x", 4096, 8192, 5000, 2, 4};
  CHECK(io::check_geometry(g).ok());
  CHECK(io::object_read_length(g) == 8192);
  auto r = io::object_read(g, 1, 3, 0);
  REQUIRE(r.ok());
  CHECK(r->offset == 4096 + 7 * 8192);
  CHECK(io::tag_layer_slot(r->tag) == 1);
  CHECK(io::tag_expert(r->tag) == 3);
  CHECK(io::object_read(g, 2, 0, 0).error().code == XPACK_E_INVALID_ARG);
  CHECK(io::object_read(g, 0, 4, 0).error().code == XPACK_E_INVALID_ARG);
  auto bad = g;
  bad.object_stride = 8000;
  CHECK(io::check_geometry(bad).error().code == XPACK_E_MISALIGNED);
  bad = g;
  bad.data_start = 100;
  CHECK(io::check_geometry(bad).error().code == XPACK_E_MISALIGNED);
  bad = g;
  bad.object_bytes = 9000;  // larger than the stride
  CHECK(io::check_geometry(bad).error().code == XPACK_E_FORMAT);
  bad = g;
  bad.n_layers = 0xFFFFFFFF;
  bad.n_experts = 0xFFFFFFFF;
  bad.object_stride = 1ull << 40;
  bad.object_bytes = 4096;
  CHECK(io::check_geometry(bad).error().code == XPACK_E_LIMIT);
  bad = g;
  bad.object_bytes = 0;
  CHECK(io::check_geometry(bad).error().code == XPACK_E_FORMAT);
}

TEST_CASE("xpack-fio --pack reads real objects") {
  TempDir dir;
  std::string path = make_pack(dir, "deepseek4", 2, 8);
  auto fio = xpack::test::build_dir() / "bench" / "xpack-fio";
  if (!std::filesystem::exists(fio)) FAIL("xpack-fio is not built at " << fio.string());
  std::string out;
  int rc = xpack::test::run_command("XPACK_FIO_KEEP_CACHE=1 " + fio.string() + " --pack " + path +
                                        " --qd 4 --ios 40 --mode uring-fixed,pread-direct --json",
                                    &out);
  REQUIRE_MESSAGE(rc == 0, out);
  CHECK(out.find("\"mode\":\"uring-fixed\"") != std::string::npos);
  CHECK(out.find("\"mode\":\"pread-direct\"") != std::string::npos);
  CHECK(out.find("\"pattern\":\"pack\"") != std::string::npos);
  CHECK(out.find("\"ios\":40") != std::string::npos);
  rc = xpack::test::run_command(fio.string() + " --pack " + path + " --h2d --ios 1", &out);
#ifndef XPACK_HAVE_CUDA
  CHECK(rc != 0);
  CHECK(out.find("CUDA") != std::string::npos);
#endif
}

namespace {
// The /proc/self/numa_maps policy of the mapping that starts at p ("default",
// "bind:0", ...), or "" when the line is not there.
std::string numa_policy_at(const void* p) {
  FILE* f = std::fopen("/proc/self/numa_maps", "r");
  if (!f) return "";
  char line[4096];
  std::string want = fmt::format("{:x} ", reinterpret_cast<uintptr_t>(p)), policy;
  while (std::fgets(line, sizeof line, f)) {
    std::string l(line);
    if (l.rfind(want, 0) != 0) continue;
    auto end = l.find(' ', want.size());
    policy = l.substr(want.size(), end - want.size());
    break;
  }
  std::fclose(f);
  return policy;
}
}  // namespace

TEST_CASE("C API: a zero-filled options struct means the defaults (O_DIRECT, any NUMA node)") {
  TempDir dir;
  std::string path = make_pack(dir, "deepseek4", 2, 4);
  PackHandle ph(path);
  xpack_engine_options zero;
  std::memset(&zero, 0, sizeof zero);
  zero.size = sizeof zero;

  // O_DIRECT, not buffered: where the filesystem refuses O_DIRECT it fails closed.
  io::FaultPlan no_direct;
  no_direct.open_direct_errno = EINVAL;
  io::set_default_fault_plan(&no_direct);
  xpack_engine* e = nullptr;
  CHECK(xpack_engine_create(ph.p, &zero, &e) == XPACK_E_NO_DIRECT_IO);
  CHECK(e == nullptr);
  xpack_cache_options czero;
  std::memset(&czero, 0, sizeof czero);
  czero.size = sizeof czero;
  czero.device = XPACK_DEVICE_HOST;
  xpack_cache* c = nullptr;
  CHECK(xpack_cache_create(ph.p, &czero, &c) == XPACK_E_NO_DIRECT_IO);
  CHECK(c == nullptr);
  io::set_default_fault_plan(nullptr);

  // And a real read through it is a direct one, into memory bound to no node.
  REQUIRE_MESSAGE(xpack_engine_create(ph.p, &zero, &e) == 0, xpack_last_error());
  xpack_read_request r{1, 2, 0};
  REQUIRE(xpack_engine_submit(e, &r, 1, sizeof(xpack_read_request)) == 0);
  auto got = reap_n(e, 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].status == 0);
  xpack_engine_counters k{};
  k.size = sizeof k;
  REQUIRE(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.fallback_count == 0);
  CHECK(k.reads >= 1);
  const void* data = nullptr;
  REQUIRE(xpack_engine_slot_data(e, 0, &data, nullptr) == 0);
  std::string policy = numa_policy_at(data);  // slot 0 is where the arena starts
  if (policy.empty()) MESSAGE("no /proc/self/numa_maps entry here: NUMA policy not checked");
  else CHECK_MESSAGE(policy.rfind("bind", 0) != 0, "staging bound by a zero-filled struct: " << policy);
  xpack_engine_destroy(e);

  // Explicit values: 1 still means O_DIRECT, XPACK_IO_BUFFERED reads buffered,
  // anything else is refused; numa_bind needs a node.
  auto o = zero;
  o.direct_io = 1;
  REQUIRE(xpack_engine_create(ph.p, &o, &e) == 0);
  xpack_engine_destroy(e);
  o.direct_io = 7;
  CHECK(xpack_engine_create(ph.p, &o, &e) == XPACK_E_INVALID_ARG);
  CHECK(std::string(xpack_last_error()).find("XPACK_IO_BUFFERED") != std::string::npos);
  czero.direct_io = 7;
  CHECK(xpack_cache_create(ph.p, &czero, &c) == XPACK_E_INVALID_ARG);
  o = zero;
  o.numa_bind = 1;
  o.numa_node = -1;
  CHECK(xpack_engine_create(ph.p, &o, &e) == XPACK_E_INVALID_ARG);
  o = zero;
  o.direct_io = XPACK_IO_BUFFERED;
  REQUIRE(xpack_engine_create(ph.p, &o, &e) == 0);
  REQUIRE(xpack_engine_submit(e, &r, 1, sizeof(xpack_read_request)) == 0);
  got = reap_n(e, 1);
  REQUIRE(xpack_engine_get_counters(e, &k) == 0);
  CHECK(k.fallback_count >= 1);
  xpack_engine_destroy(e);
}
