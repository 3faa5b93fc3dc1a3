// Host backend of the device layer: copies, event semantics, ordering, memory budget.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "device/device.h"

using namespace xpack;
using namespace xpack::device;

TEST_CASE("host device: copy lands and event completes") {
  auto dev = make_host_device();
  std::vector<uint8_t> src(1 << 20);
  std::iota(src.begin(), src.end(), 0);
  auto mem = dev->allocate(src.size());
  REQUIRE(mem.ok());
  auto ev = dev->create_event();
  REQUIRE(ev.ok());
  REQUIRE(dev->copy_to_device_async(*mem, src.data(), src.size(), ev->get()).ok());
  REQUIRE((*ev)->wait().ok());
  auto q = (*ev)->query();
  REQUIRE(q.ok());
  CHECK(*q);
  std::vector<uint8_t> back(src.size());
  REQUIRE(dev->copy_to_host(back.data(), *mem, back.size()).ok());
  CHECK(back == src);
  dev->deallocate(*mem);
}

TEST_CASE("host device: never-recorded event is complete, recorded one is pending until copy ends") {
  HostDeviceOptions o;
  o.copy_bytes_per_second = 10'000'000;  // 1 MB takes 100 ms
  auto dev = make_host_device(o);
  auto ev = dev->create_event();
  REQUIRE(ev.ok());
  CHECK(*(*ev)->query());
  std::vector<uint8_t> src(1'000'000, 7);
  auto mem = dev->allocate(src.size());
  REQUIRE(mem.ok());
  REQUIRE(dev->copy_to_device_async(*mem, src.data(), src.size(), nullptr).ok());
  REQUIRE(dev->record(**ev).ok());
  CHECK_FALSE(*(*ev)->query());  // the copy needs 100 ms
  REQUIRE((*ev)->wait().ok());
  CHECK(*(*ev)->query());
  // Re-recording on an idle stream completes at once.
  REQUIRE(dev->record(**ev).ok());
  CHECK(*(*ev)->query());
  dev->deallocate(*mem);
}

TEST_CASE("host device: copies run in enqueue order; an event covers earlier copies") {
  HostDeviceOptions o;
  o.copy_bytes_per_second = 100'000'000;
  auto dev = make_host_device(o);
  auto mem = dev->allocate(4096);
  REQUIRE(mem.ok());
  std::vector<uint8_t> a(4096, 1), b(4096, 2), c(4096, 3);
  auto e1 = dev->create_event();
  auto e3 = dev->create_event();
  REQUIRE(dev->copy_to_device_async(*mem, a.data(), 4096, e1->get()).ok());
  REQUIRE(dev->copy_to_device_async(*mem, b.data(), 4096, nullptr).ok());
  REQUIRE(dev->copy_to_device_async(*mem, c.data(), 4096, e3->get()).ok());
  REQUIRE((*e3)->wait().ok());
  CHECK(*(*e1)->query());  // FIFO: e1 is before e3
  std::vector<uint8_t> back(4096);
  REQUIRE(dev->copy_to_host(back.data(), *mem, 4096).ok());
  CHECK(back == c);
  dev->deallocate(*mem);
}

TEST_CASE("host device: device->host copies share the stream's order with host->device ones") {
  // The host tier relies on it: a slot is copied out before the copy that
  // overwrites it, and a host range written before a later copy reads it.
  HostDeviceOptions o;
  o.copy_bytes_per_second = 100'000'000;
  auto dev = make_host_device(o);
  auto slot = dev->allocate(4096);
  REQUIRE(slot.ok());
  std::vector<uint8_t> a(4096, 1), b(4096, 2), out(4096, 0), back(4096, 0);
  auto done = dev->create_event();
  REQUIRE(done.ok());
  REQUIRE(dev->copy_to_device_async(*slot, a.data(), 4096, nullptr).ok());
  REQUIRE(dev->copy_to_host_async(out.data(), *slot, 4096, nullptr).ok());
  REQUIRE(dev->copy_to_device_async(*slot, b.data(), 4096, nullptr).ok());
  REQUIRE(dev->copy_to_host_async(back.data(), *slot, 4096, done->get()).ok());
  CHECK_FALSE(*(*done)->query());
  REQUIRE((*done)->wait().ok());
  CHECK(out == a);
  CHECK(back == b);
  CHECK_FALSE(dev->copy_to_host_async(nullptr, *slot, 16, nullptr).ok());
  dev->deallocate(*slot);
}

TEST_CASE("host device: memory budget is enforced and returned on free") {
  HostDeviceOptions o;
  o.memory_bytes = 1 << 20;
  auto dev = make_host_device(o);
  auto info = dev->memory_info();
  REQUIRE(info.ok());
  CHECK(info->free_bytes == (1u << 20));
  auto a = dev->allocate(600'000);
  REQUIRE(a.ok());
  CHECK(dev->memory_info()->free_bytes == (1u << 20) - 600'000);
  auto b = dev->allocate(600'000);
  CHECK_FALSE(b.ok());
  CHECK(b.error().code == XPACK_E_DEVICE);
  CHECK_FALSE(dev->allocate(0).ok());
  dev->deallocate(*a);
  CHECK(dev->memory_info()->free_bytes == (1u << 20));
  auto c = dev->allocate(600'000);
  CHECK(c.ok());
  dev->deallocate(*c);
  dev->deallocate(nullptr);  // accepted
}

TEST_CASE("host device: null pointers are rejected") {
  auto dev = make_host_device();
  CHECK(dev->copy_to_device_async(nullptr, "x", 1, nullptr).error().code == XPACK_E_INVALID_ARG);
  CHECK(dev->register_host(nullptr, 10).error().code == XPACK_E_INVALID_ARG);
}

TEST_CASE("host device: concurrent copies from several threads each land intact") {
  auto dev = make_host_device();
  constexpr int kThreads = 4, kPerThread = 50, kBytes = 8192;
  auto mem = dev->allocate(size_t{kThreads} * kPerThread * kBytes);
  REQUIRE(mem.ok());
  auto* base = static_cast<uint8_t*>(*mem);
  std::vector<std::vector<uint8_t>> src(kThreads * kPerThread);
  for (size_t i = 0; i < src.size(); ++i) src[i].assign(kBytes, uint8_t(i * 31 + 5));
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int idx = t * kPerThread + i;
        auto ev = dev->create_event();
        REQUIRE(ev.ok());
        REQUIRE(dev->copy_to_device_async(base + size_t(idx) * kBytes, src[idx].data(), kBytes,
                                          ev->get()).ok());
        REQUIRE((*ev)->wait().ok());
      }
    });
  }
  for (auto& t : ts) t.join();
  std::vector<uint8_t> back(kBytes);
  for (size_t i = 0; i < src.size(); ++i) {
    REQUIRE(dev->copy_to_host(back.data(), base + i * kBytes, kBytes).ok());
    CHECK(back == src[i]);
  }
  dev->deallocate(*mem);
}

#ifndef XPACK_HAVE_CUDA
TEST_CASE("cuda device: unsupported in a build without CUDA") {
  auto d = make_cuda_device(0);
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().code == XPACK_E_UNSUPPORTED);
}
#endif
