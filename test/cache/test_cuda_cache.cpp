// The CUDA device backend and the cache on it (GPU machine). Without a usable
// GPU (or in a build without CUDA) every case reports itself skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

#include "cache/expert_cache.h"
#include "object_file.h"
#include "skip.h"

using namespace xpack;
using namespace xpack::cache;
using xpack::test::expected_object;

namespace {

std::unique_ptr<device::Device> cuda_or_skip() {
  auto d = device::make_cuda_device(0);
  if (!d.ok()) {
    xpack::test::skip(xpack::test::Absent::kCapability, std::string("no CUDA device: ") + d.error().message);
    return nullptr;
  }
  return std::move(*d);
}

constexpr uint64_t kObj = 3 * 1024 * 1024 + 1000;  // not a multiple of 4096

}  // namespace

TEST_CASE("cuda device: copies, events, ordering, memory info") {
  auto dev = cuda_or_skip();
  if (!dev) return;
  CHECK(std::string(dev->backend_name()) == "cuda");
  auto info = dev->memory_info();
  REQUIRE(info.ok());
  CHECK(info->free_bytes > 0);
  CHECK(info->free_bytes <= info->total_bytes);
  std::vector<uint8_t> a(1 << 24), b(1 << 24);
  std::iota(a.begin(), a.end(), 1);
  std::iota(b.begin(), b.end(), 7);
  REQUIRE(dev->register_host(a.data(), a.size()).ok());
  auto mem = dev->allocate(a.size());
  REQUIRE(mem.ok());
  auto ev = dev->create_event();
  REQUIRE(ev.ok());
  CHECK(*(*ev)->query());  // never recorded
  CHECK((*ev)->native_handle() != nullptr);
  REQUIRE(dev->copy_to_device_async(*mem, a.data(), a.size(), nullptr).ok());
  REQUIRE(dev->copy_to_device_async(*mem, b.data(), b.size(), ev->get()).ok());
  REQUIRE((*ev)->wait().ok());
  CHECK(*(*ev)->query());
  std::vector<uint8_t> back(a.size());
  REQUIRE(dev->copy_to_host(back.data(), *mem, back.size()).ok());
  CHECK(back == b);  // FIFO: the later copy wins
  REQUIRE(dev->order_after(nullptr).ok());
  dev->deallocate(*mem);
  dev->unregister_host(a.data());
}

TEST_CASE("cuda cache: every slot byte-exact, concurrent users, injected EIO") {
  auto dev = cuda_or_skip();
  if (!dev) return;
  test::TempDir dir;
  auto src = test::write_object_file(dir / "objects.bin", 2, 24, kObj, 4);
  io::FaultPlan plan;
  plan.completions.push_back({make_key(1, 23), -1, EIO, 0, 1});
  CacheOptions o;
  o.budget_bytes = 12 * ((kObj + 255) / 256 * 256);
  o.read_splits = 4;
  o.verify = true;
  o.faults = &plan;
  auto c = ExpertCache::create(src, *dev, o);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
  REQUIRE((*c)->slot_count() == 12);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng(t + 11);
      for (int i = 0; i < 40; ++i) {
        uint32_t layer = rng() % 2;
        std::vector<uint32_t> ids = {uint32_t(rng() % 23), uint32_t(rng() % 23)};
        auto a = (*c)->acquire(layer, ids.data(), ids.size());
        if (!a.ok()) {
          if (a.error().code != XPACK_E_CAPACITY) ++failures;
          continue;
        }
        if (!(*c)->wait_all(a->ticket).ok()) ++failures;
        for (auto& h : a->experts) {
          std::vector<uint8_t> got(kObj);
          if (!dev->copy_to_host(got.data(), h.data, kObj).ok() ||
              got != expected_object(layer, h.expert, kObj))
            ++failures;
        }
        if (!(*c)->release(a->ticket).ok()) ++failures;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(failures == 0);
  uint32_t bad = 23;
  auto a = (*c)->acquire(1, &bad, 1);
  REQUIRE(a.ok());
  CHECK((*c)->wait_all(a->ticket).error().code == -EIO);
  REQUIRE((*c)->release(a->ticket).ok());
  a = (*c)->acquire(1, &bad, 1);
  REQUIRE(a.ok());
  CHECK((*c)->wait_all(a->ticket).ok());
  std::vector<uint8_t> got(kObj);
  REQUIRE(dev->copy_to_host(got.data(), a->experts[0].data, kObj).ok());
  CHECK(got == expected_object(1, 23, kObj));
  REQUIRE((*c)->release(a->ticket).ok());
  auto s = (*c)->counters();
  CHECK(s.io_errors == 1);
  MESSAGE("cuda cache: " << s.cache_misses << " misses, " << s.cache_hits << " hits, read p50 <= "
                         << s.read_latency.quantile_ns(0.5) << " ns, h2d p50 <= "
                         << s.h2d_latency.quantile_ns(0.5) << " ns");
}

TEST_CASE("cuda cache: deferred acquires stream whole layers through few slots, byte-exact") {
  auto dev = cuda_or_skip();
  if (!dev) return;
  test::TempDir dir;
  auto src = test::write_object_file(dir / "objects.bin", 2, 24, kObj, 4);
  CacheOptions o;
  o.budget_bytes = 6 * ((kObj + 255) / 256 * 256);
  o.read_splits = 2;
  auto c = ExpertCache::create(src, *dev, o);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
  REQUIRE((*c)->slot_count() == 6);
  // Two threads each stream a whole layer (24 experts) through the 6 slots at
  // once: wait, check the bytes on the device, release the expert, next.
  CHECK(test::stream_layers_concurrently(**c, *dev, 2, 24, 3, kObj) == 0);
  auto s = (*c)->counters();
  CHECK(s.cache_hits + s.cache_misses == 2 * 3 * 24);
  CHECK(s.io_errors == 0);
  MESSAGE("cuda deferred: " << s.cache_misses << " misses, " << s.cache_hits << " hits");
}
