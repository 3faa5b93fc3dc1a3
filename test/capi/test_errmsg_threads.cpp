// Per-handle error messages under concurrency: several threads make failing calls
// on ONE handle (gguf, pack, cache; the engine's handle is written by its issuing
// thread only) with arguments of their own, and each
// must read back a message naming its own arguments. Before the messages were per
// thread, the pack handle's string was assigned without a lock (heap corruption
// under xpack-run -t 8) and the others were read while another thread reassigned
// them; TSan reports both, and without TSan the messages name other threads'
// arguments. Runs in the TSan CI stage (suite capi).
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "fixtures.h"
#include "pack/builder.h"
#include "xpack/xpack.h"

using namespace xpack;
using xpack::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int kThreads = 8;
constexpr int kRounds = 400;

struct Env {
  TempDir dir;
  std::string pack_path, trunk_path;
  Env() {
    auto synth = xpack::test::build_dir() / "tools" / "xpack-synth";
    if (!fs::exists(synth)) FAIL("xpack-synth is not built at " << synth.string());
    auto gguf = dir / "k3.gguf";
    std::string out;
    int rc = xpack::test::run_command(
        synth.string() + " --arch kimi-k3 --layers 3 --experts 8 --top-k 2 -q -o " + gguf.string(), &out);
    REQUIRE_MESSAGE(rc == 0, out);
    pack::BuildOptions bo;
    bo.source = gguf.string();
    bo.out = (dir / "k3").string();
    auto rep = pack::build_pack(bo);
    REQUIRE_MESSAGE(rep.ok(), (rep.ok() ? "" : rep.error().message));
    pack_path = rep->pack_path;
    trunk_path = (dir / "k3.trunk.gguf").string();
  }
};

// Runs body(thread, round) on kThreads threads started together; body returns
// the message it read and the text that message must contain. Bodies yield
// between the failing call and reading the message, as a caller doing anything in
// between would, so other threads' failures land in that window.
template <class F>
void hammer(F body) {
  std::atomic<int> ready{0};
  std::atomic<int> wrong{0};
  std::vector<std::string> first_wrong(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int i = 0; i < kRounds; ++i) {
        auto [msg, want] = body(t, i);
        if (msg.find(want) == std::string::npos) {
          if (wrong.fetch_add(1) == 0) first_wrong[t] = "'" + msg + "' lacks '" + want + "'";
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  std::string example;
  for (auto& s : first_wrong)
    if (!s.empty()) example = s;
  CHECK_MESSAGE(wrong.load() == 0, wrong.load() << " wrong messages, e.g. " << example);
}

}  // namespace

TEST_CASE("pack, gguf and cache handles: each thread reads its own message") {
  static Env env;  // built once, not once per SUBCASE
  xpack_pack* p = nullptr;
  REQUIRE_MESSAGE(xpack_pack_open(env.pack_path.c_str(), nullptr, &p) == 0, xpack_last_error());

  SUBCASE("pack: read_object, find_role") {
    hammer([&](int t, int i) {
      std::string msg, want;
      if (i % 2 == 0) {
        uint32_t layer = 1000 + uint32_t(t), expert = 5000 + uint32_t(i);
        char buf[16];
        int rc = xpack_pack_read_object(p, layer, expert, buf, sizeof buf, 0);
        std::this_thread::yield();
        msg = rc == XPACK_E_INVALID_ARG ? xpack_pack_errmsg(p) : "rc " + std::to_string(rc);
        want = "layer slot " + std::to_string(layer) + ", expert " + std::to_string(expert);
      } else {
        std::string role = "role-" + std::to_string(t) + "-" + std::to_string(i);
        int rc = xpack_pack_find_role(p, role.c_str());
        std::this_thread::yield();
        msg = rc == XPACK_E_NOT_FOUND ? xpack_pack_errmsg(p) : "rc " + std::to_string(rc);
        want = "'" + role + "'";
      }
      return std::pair{msg, want};
    });
  }

  SUBCASE("gguf: find_key, find_tensor") {
    xpack_gguf* g = nullptr;
    REQUIRE_MESSAGE(xpack_gguf_open(env.trunk_path.c_str(), nullptr, &g) == 0, xpack_last_error());
    hammer([&](int t, int i) {
      std::string name = "missing." + std::to_string(t) + "." + std::to_string(i);
      int64_t rc = i % 2 == 0 ? xpack_gguf_find_key(g, name.c_str()) : xpack_gguf_find_tensor(g, name.c_str());
      std::this_thread::yield();
      std::string msg = rc == XPACK_E_NOT_FOUND ? xpack_gguf_errmsg(g) : "rc " + std::to_string(rc);
      return std::pair{msg, "'" + name + "'"};
    });
    xpack_gguf_close(g);
  }

  SUBCASE("cache: slot_pointer, read_slot") {
    xpack_pack_info info{};
    info.size = sizeof info;
    REQUIRE(xpack_pack_get_info(p, &info) == 0);
    xpack_cache_options o;
    REQUIRE(xpack_cache_options_init(&o) == 0);
    o.device = XPACK_DEVICE_HOST;
    o.budget_bytes = 4 * ((info.object_bytes + 255) / 256 * 256);
    xpack_cache* c = nullptr;
    int rc = xpack_cache_create(p, &o, &c);
    if (rc == XPACK_E_NO_DIRECT_IO || rc == XPACK_E_URING) {
      MESSAGE("cache not available here: " << xpack_last_error());
    } else {
      REQUIRE_MESSAGE(rc == 0, xpack_last_error());
      std::vector<uint8_t> dst(info.object_bytes);
      hammer([&](int t, int i) {
        uint32_t slot = 100000 + uint32_t(t) * 1000 + uint32_t(i);
        void* ptr = nullptr;
        int rc = i % 2 == 0 ? xpack_cache_slot_pointer(c, slot, &ptr)
                            : xpack_cache_read_slot(c, slot, dst.data(), dst.size());
        std::this_thread::yield();
        std::string msg = rc == XPACK_E_INVALID_ARG ? xpack_cache_errmsg(c) : "rc " + std::to_string(rc);
        return std::pair{msg, "slot " + std::to_string(slot) + " "};
      });
      xpack_cache_destroy(c);
    }
  }

  SUBCASE("a thread that never failed reads an empty message") {
    char buf[16];
    CHECK(xpack_pack_read_object(p, 999, 0, buf, sizeof buf, 0) == XPACK_E_INVALID_ARG);
    std::string other;
    std::thread([&] { other = xpack_pack_errmsg(p); }).join();
    CHECK(other.empty());
    CHECK(std::string(xpack_pack_errmsg(p)).find("layer slot 999") != std::string::npos);
  }
  xpack_pack_close(p);
}
