// A synthetic object file for cache tests: n_layers x n_experts objects of
// `object_bytes` each (stride rounded to 4096), every byte a function of
// (layer, expert, offset) so a misplaced or torn object is detected.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <xxhash.h>

#include "cache/expert_cache.h"
#include "cache/object_source.h"
#include "fixtures.h"

namespace xpack::test {

inline uint8_t object_byte(uint32_t layer, uint32_t expert, uint64_t i) {
  uint64_t x = (uint64_t(layer) * 1000003u + expert) * 2654435761u + i * 40503u;
  return uint8_t(x ^ (x >> 13) ^ (i >> 8));
}

inline std::vector<uint8_t> expected_object(uint32_t layer, uint32_t expert, uint64_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = object_byte(layer, expert, i);
  return v;
}

inline cache::ObjectSource write_object_file(const std::filesystem::path& path, uint32_t n_layers,
                                             uint32_t n_experts, uint64_t object_bytes,
                                             uint32_t top_k) {
  uint64_t stride = (object_bytes + 4095) / 4096 * 4096;
  std::vector<uint8_t> file(stride * n_layers * n_experts, 0);
  std::vector<uint64_t> sums(size_t(n_layers) * n_experts);
  for (uint32_t l = 0; l < n_layers; ++l)
    for (uint32_t e = 0; e < n_experts; ++e) {
      uint64_t base = (uint64_t(l) * n_experts + e) * stride;
      for (uint64_t i = 0; i < object_bytes; ++i) file[base + i] = object_byte(l, e, i);
      sums[size_t(l) * n_experts + e] = XXH3_64bits(file.data() + base, object_bytes);
    }
  write_file(path, file);
  cache::ObjectSource s;
  s.path = path.string();
  s.n_layers = n_layers;
  s.n_experts = n_experts;
  s.top_k = top_k;
  s.object_bytes = object_bytes;
  s.read_bytes = stride;
  s.offset = [n_experts, stride](uint32_t l, uint32_t e) {
    return (uint64_t(l) * n_experts + e) * stride;
  };
  s.checksum = [sums, n_experts](uint32_t l, uint32_t e) { return sums[size_t(l) * n_experts + e]; };
  return s;
}

// An object file of 10000-byte objects on a host device: what most cache tests
// build their caches over.
struct CacheFixture {
  static constexpr uint64_t kObj = 10000;     // payload bytes: slot stride 10240, read and frame 12288
  static constexpr uint64_t kStride = 10240;
  static constexpr uint64_t kFrame = 12288;
  TempDir dir;
  cache::ObjectSource src;
  std::unique_ptr<device::Device> dev;
  explicit CacheFixture(uint32_t layers = 2, uint32_t experts = 16, uint32_t top_k = 2,
                        device::HostDeviceOptions dopts = {}) {
    src = write_object_file(dir / "objects.bin", layers, experts, kObj, top_k);
    dev = device::make_host_device(dopts);
  }
  // A cache of exactly `slots` slots (the budget, unless `o` sets one).
  std::unique_ptr<cache::ExpertCache> make(uint32_t slots, cache::CacheOptions o = {}) {
    if (!o.budget_bytes) o.budget_bytes = slots * kStride;
    auto c = cache::ExpertCache::create(src, *dev, o);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
    REQUIRE((*c)->slot_count() == slots);
    return std::move(*c);
  }
  // The same with a host tier of exactly `frames` frames.
  std::unique_ptr<cache::ExpertCache> make_tiered(uint32_t slots, uint32_t frames, cache::CacheOptions o = {}) {
    o.host_cache_bytes = frames * kFrame;
    auto c = make(slots, o);
    REQUIRE(c->host_frame_count() == frames);
    return c;
  }
};

// Streams `ids` of `layer` through the cache with one deferred acquire, the
// way a runtime computes: wait for entry i, check its bytes on the device,
// release it, next. Returns how many steps failed. Each expert is released even
// after a failure, so a second thread streaming at the same time never waits
// forever.
inline int stream_layer_deferred(cache::ExpertCache& c, device::Device& dev, uint32_t layer,
                                 const std::vector<uint32_t>& ids, uint64_t object_bytes) {
  auto a = c.acquire(layer, ids.data(), ids.size(), uint32_t(ids.size()), /*defer=*/true);
  if (!a.ok()) return 1;
  int failures = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    bool ok = c.wait(a->ticket, i).ok();
    auto h = c.entry(a->ticket, i);
    ok = ok && h.ok() && h->slot != cache::kNoSlot;
    std::vector<uint8_t> got(object_bytes);
    ok = ok && dev.copy_to_host(got.data(), h->data, object_bytes).ok() &&
         got == expected_object(layer, ids[i], object_bytes);
    ok = c.release_expert(a->ticket, i).ok() && ok;
    failures += !ok;
  }
  if (!c.release(a->ticket).ok()) ++failures;
  return failures;
}

// n_threads threads each make `iters` requests of `per_request` random experts
// (ids below `id_range`, layers below `n_layers`) at once: acquire, wait, check
// every slot's bytes, release. An acquire refused because the other threads
// hold every slot is legal and retried later. Returns how many steps failed.
inline int random_requests_concurrently(cache::ExpertCache& c, device::Device& dev, int n_threads, int iters,
                                        uint32_t n_layers, uint32_t id_range, int per_request,
                                        uint64_t object_bytes, uint32_t seed) {
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < n_threads; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng(seed * 7919u + uint32_t(t) + 1);
      for (int i = 0; i < iters; ++i) {
        uint32_t layer = rng() % n_layers;
        std::vector<uint32_t> ids;
        for (int k = 0; k < per_request; ++k) ids.push_back(rng() % id_range);
        auto a = c.acquire(layer, ids.data(), ids.size(), 1);
        if (!a.ok()) {
          if (a.error().code != XPACK_E_CAPACITY) ++failures;
          continue;
        }
        if (!c.wait_all(a->ticket).ok()) ++failures;
        for (auto& h : a->experts) {
          std::vector<uint8_t> got(object_bytes);
          if (!dev.copy_to_host(got.data(), h.data, object_bytes).ok() ||
              got != expected_object(layer, h.expert, object_bytes))
            ++failures;
        }
        if (!c.release(a->ticket).ok()) ++failures;
      }
    });
  for (auto& t : ts) t.join();
  return failures;
}

// Thread t streams layer t (all of its experts, in an order of its own) through
// the cache `rounds` times, all threads at once. Returns how many steps failed.
inline int stream_layers_concurrently(cache::ExpertCache& c, device::Device& dev,
                                      uint32_t n_threads, uint32_t n_experts, int rounds,
                                      uint64_t object_bytes) {
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < n_threads; ++t)
    ts.emplace_back([&, t] {
      std::vector<uint32_t> ids(n_experts);
      std::iota(ids.begin(), ids.end(), 0u);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(t + 3));
      for (int round = 0; round < rounds; ++round)
        failures += stream_layer_deferred(c, dev, t, ids, object_bytes);
    });
  for (auto& t : ts) t.join();
  return failures;
}

}  // namespace xpack::test
