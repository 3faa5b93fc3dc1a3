// The expert cache core on the host device backend: sizing, delivery, bytes in
// slots, protection, exact counters, prefetch, verification, I/O errors,
// telemetry files, concurrency (run under TSan in build-cache-tsan).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cache/expert_cache.h"
#include "cache/replay.h"
#include "object_file.h"

using namespace xpack;
using namespace xpack::cache;
using xpack::test::expected_object;

namespace {

using Fixture = test::CacheFixture;
constexpr uint64_t kObj = Fixture::kObj;
constexpr uint64_t kStride = Fixture::kStride;

void check_slot_bytes(device::Device& dev, const ExpertHandle& h, uint32_t layer) {
  std::vector<uint8_t> got(kObj);
  REQUIRE(dev.copy_to_host(got.data(), h.data, kObj).ok());
  CHECK_MESSAGE(got == expected_object(layer, h.expert, kObj),
                "slot " << h.slot << " expert " << h.expert);
}

Acquired acquire_ok(ExpertCache& c, uint32_t layer, std::vector<uint32_t> ids, uint32_t tok = 1) {
  auto a = c.acquire(layer, ids.data(), ids.size(), tok);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  return std::move(*a);
}

// A cache of `slots` slots under `policy`, every other option its default.
std::unique_ptr<ExpertCache> make_cache(Fixture& f, uint32_t slots, PolicyKind policy) {
  CacheOptions o;
  o.policy = policy;
  return f.make(slots, o);
}

// One whole request: acquire, wait, release; whether every expert was a hit.
bool use_all(ExpertCache& c, uint32_t layer, std::vector<uint32_t> ids) {
  auto a = acquire_ok(c, layer, std::move(ids));
  REQUIRE(c.wait_all(a.ticket).ok());
  REQUIRE(c.release(a.ticket).ok());
  bool all_hit = true;
  for (const auto& h : a.experts) all_hit = all_hit && h.hit;
  return all_hit;
}

}  // namespace

TEST_CASE("cache: slot count from the byte budget, reserve and free memory") {
  device::HostDeviceOptions d;
  d.memory_bytes = 20 * kStride + 5;
  Fixture f(2, 16, 2, d);
  CacheOptions o;
  o.budget_bytes = 9 * kStride + kStride - 1;  // floor -> 9
  auto c = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE(c.ok());
  CHECK((*c)->slot_count() == 9);
  c->reset();
  // Budget larger than free - reserve: the reserve wins.
  o.budget_bytes = 100 * kStride;
  o.reserve_bytes = 16 * kStride;
  c = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE(c.ok());
  CHECK((*c)->slot_count() == 4);
  CHECK(f.dev->memory_info()->free_bytes == 16 * kStride + 5);  // 4 slots allocated
  c->reset();
  CHECK(f.dev->memory_info()->free_bytes == 20 * kStride + 5);  // freed on destroy
  // Fewer slots than top-k: refused with XPACK_E_CAPACITY.
  o.budget_bytes = 1 * kStride;
  o.reserve_bytes = 0;
  auto bad = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == XPACK_E_CAPACITY);
  o.reserve_bytes = 20 * kStride;  // nothing left
  o.budget_bytes = 0;
  CHECK(ExpertCache::create(f.src, *f.dev, o).error().code == XPACK_E_CAPACITY);
  o = {};
  o.policy = PolicyKind::kBelady;
  CHECK(ExpertCache::create(f.src, *f.dev, o).error().code == XPACK_E_INVALID_ARG);
}

TEST_CASE("cache: every delivered slot holds exactly its pack object") {
  Fixture f(3, 16, 4);
  auto c = f.make(10);
  for (uint32_t layer = 0; layer < 3; ++layer)
    for (uint32_t first = 0; first < 16; first += 4) {
      auto a = acquire_ok(*c, layer, {first + 3, first, first + 2, first + 1});
      REQUIRE(c->wait_all(a.ticket).ok());
      for (auto& h : a.experts) check_slot_bytes(*f.dev, h, layer);
      REQUIRE(c->release(a.ticket).ok());
    }
  auto s = c->counters();
  CHECK(s.cache_misses == 48);
  CHECK(s.pack_reads == 48);
  CHECK(s.h2d_bytes == 48 * kObj);
  CHECK(s.pack_read_bytes == 48 * 12288);
  CHECK(s.io_errors == 0);
}

TEST_CASE("cache: counters exact on a scripted trace, equal to the simulator's") {
  // 1 2 3 1 4 2 5 1 2 3 in 3 slots: hand-computed LRU hits 2, misses 8, evictions 5.
  std::vector<uint32_t> seq = {1, 2, 3, 1, 4, 2, 5, 1, 2, 3};
  for (auto kind : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kHybrid}) {
    Fixture f(1, 8, 1);
    auto c = make_cache(f, 3, kind);
    std::vector<stats::TraceRecord> trace;
    for (size_t i = 0; i < seq.size(); ++i) {
      auto a = acquire_ok(*c, 0, {seq[i]});
      REQUIRE(c->wait_all(a.ticket).ok());
      check_slot_bytes(*f.dev, a.experts[0], 0);
      REQUIRE(c->release(a.ticket).ok());
      trace.push_back({i, 0, seq[i]});
    }
    ReplayOptions ro;
    ro.capacity = 3;
    ro.policy = kind;
    auto sim = replay_trace(trace, ro);
    REQUIRE(sim.ok());
    auto s = c->counters();
    CAPTURE(policy_name(kind));
    CHECK(s.cache_hits == sim->hits);
    CHECK(s.cache_misses == sim->misses);
    CHECK(s.cache_evictions == sim->evictions);
    CHECK(s.route_calls_by_layer[0] == 10);
    CHECK(s.steps == 10);
    if (kind == PolicyKind::kLru) {
      CHECK(s.cache_hits == 2);
      CHECK(s.cache_misses == 8);
      CHECK(s.cache_evictions == 5);
    }
  }
}

TEST_CASE("cache: counters equal the simulator's on random multi-expert requests") {
  // Requests of several experts (decode: 3 distinct, prefill: up to 7) over two
  // layers: the live cache must protect a whole request while placing it, as
  // xpack-sim does, or it evicts an expert the same request is about to hit.
  std::mt19937 rng(1234);
  std::vector<std::vector<uint32_t>> reqs;
  for (int step = 0; step < 120; ++step) {
    size_t width = step % 10 == 0 ? 7 : 3;
    std::vector<uint32_t> ids;
    while (ids.size() < width) {
      // Skewed: low ids are hot, so there are hits and evictions both.
      uint32_t e = uint32_t(std::min<double>(15, std::abs(std::normal_distribution<>(0, 5)(rng))));
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    reqs.push_back(ids);
  }
  for (auto kind : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kHybrid}) {
    Fixture f(2, 16, 3);
    auto c = make_cache(f, 8, kind);
    std::vector<stats::TraceRecord> trace;
    for (size_t i = 0; i < reqs.size(); ++i) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        auto a = acquire_ok(*c, layer, reqs[i], uint32_t(reqs[i].size() > 3 ? 5 : 1));
        REQUIRE(c->wait_all(a.ticket).ok());
        REQUIRE(c->release(a.ticket).ok());
        for (uint32_t e : reqs[i]) trace.push_back({i, layer, e});
      }
    }
    ReplayOptions ro;
    ro.capacity = 8;
    ro.policy = kind;
    ro.top_k = 3;
    auto sim = replay_trace(trace, ro);
    REQUIRE(sim.ok());
    auto s = c->counters();
    CAPTURE(policy_name(kind));
    CHECK(sim->bypassed == 0);
    CHECK(s.cache_hits == sim->hits);
    CHECK(s.cache_misses == sim->misses);
    CHECK(s.cache_evictions == sim->evictions);
    CHECK(s.cache_hits > 100);
    CHECK(s.cache_evictions > 100);
  }
}

TEST_CASE("cache: a deferred acquire wider than the cache streams through it") {
  Fixture f(1, 16, 2);
  auto c = make_cache(f, 3, PolicyKind::kLru);
  std::vector<uint32_t> ids = {9, 4, 9, 7, 1, 12};  // 5 distinct, 3 slots
  auto plain = c->acquire(0, ids.data(), ids.size(), 6);
  REQUIRE_FALSE(plain.ok());
  CHECK(plain.error().code == XPACK_E_CAPACITY);
  CHECK(plain.error().message.find("defer") != std::string::npos);

  auto a = c->acquire(0, ids.data(), ids.size(), 6, /*defer=*/true);
  REQUIRE(a.ok());
  // Placed in request order: 9, 4, 7 now; 1 and 12 wait.
  CHECK(a->experts[0].slot != kNoSlot);
  CHECK(a->experts[1].slot != kNoSlot);
  CHECK(a->experts[2].slot == a->experts[0].slot);  // the same expert again
  CHECK(a->experts[3].slot != kNoSlot);
  CHECK(a->experts[4].slot == kNoSlot);
  CHECK(a->experts[4].data == nullptr);
  CHECK(a->experts[5].slot == kNoSlot);
  // Waiting for a deferred expert while this request holds every slot would
  // never end: refused.
  auto w = c->wait(a->ticket, 4);
  REQUIRE_FALSE(w.ok());
  CHECK(w.error().code == XPACK_E_CAPACITY);
  // Stream: wait, check, release, and the next deferred expert takes the slot.
  for (size_t i : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(5)}) {
    REQUIRE(c->wait(a->ticket, i).ok());
    auto h = c->entry(a->ticket, i);
    REQUIRE(h.ok());
    REQUIRE(h->slot != kNoSlot);
    CHECK(h->expert == ids[i]);
    check_slot_bytes(*f.dev, *h, 0);
    REQUIRE(c->release_expert(a->ticket, i).ok());
  }
  // Entry 2 named expert 9 too: released with entry 0.
  CHECK(c->wait(a->ticket, 2).error().code == XPACK_E_INVALID_ARG);
  CHECK(c->release_expert(a->ticket, 2).error().code == XPACK_E_INVALID_ARG);
  REQUIRE(c->release(a->ticket).ok());
  auto s = c->counters();
  CHECK(s.cache_misses == 5);
  CHECK(s.cache_hits == 0);
  CHECK(s.pack_reads == 5);
  CHECK(s.cache_evictions == 2);
}

TEST_CASE("cache: deferred experts take slots released by another request, first come first served") {
  Fixture f(1, 16, 2);
  auto c = make_cache(f, 3, PolicyKind::kLru);
  auto holder = acquire_ok(*c, 0, {1, 2, 3});
  REQUIRE(c->wait_all(holder.ticket).ok());
  std::vector<uint32_t> first = {4, 5};
  auto b = c->acquire(0, first.data(), 2, 1, true);
  REQUIRE(b.ok());
  CHECK(b->experts[0].slot == kNoSlot);
  std::vector<uint32_t> second = {2, 6};
  auto d = c->acquire(0, second.data(), 2, 1, true);
  REQUIRE(d.ok());
  // Queued behind b, not before it: even its resident expert 2 waits in line,
  // so requests that wait never hold slots another waiting one needs.
  CHECK(d->experts[0].slot == kNoSlot);
  CHECK(d->experts[1].slot == kNoSlot);
  // A waiter on another thread is woken when the holder releases.
  std::atomic<int> waited{1};
  std::thread t([&] { waited = c->wait_all(b->ticket).ok() ? 0 : -1; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(waited == 1);
  REQUIRE(c->release(holder.ticket).ok());
  t.join();
  CHECK(waited == 0);
  for (size_t i = 0; i < 2; ++i) check_slot_bytes(*f.dev, *c->entry(b->ticket, i), 0);
  // b's loads evicted 1 and 3, not 2, which d was waiting for: d holds it
  // (a hit), and 6 waits until b lets go.
  CHECK(c->entry(d->ticket, 0)->hit);
  CHECK(c->entry(d->ticket, 1)->slot == kNoSlot);
  auto prefetched = c->prefetch(0, std::vector<uint32_t>{8}.data(), 1);
  REQUIRE(prefetched.ok());
  CHECK(*prefetched == 0);  // guesses never take a slot a request waits for
  REQUIRE(c->release(b->ticket).ok());
  REQUIRE(c->wait_all(d->ticket).ok());
  check_slot_bytes(*f.dev, *c->entry(d->ticket, 0), 0);
  check_slot_bytes(*f.dev, *c->entry(d->ticket, 1), 0);
  REQUIRE(c->release(d->ticket).ok());
  // Releasing a ticket with experts still deferred drops them unread.
  auto g = acquire_ok(*c, 0, {10, 11, 12});
  std::vector<uint32_t> more = {13};
  auto h = c->acquire(0, more.data(), 1, 1, true);
  REQUIRE(h.ok());
  REQUIRE(c->release(h->ticket).ok());
  REQUIRE(c->wait_all(g.ticket).ok());
  REQUIRE(c->release(g.ticket).ok());
  auto s = c->counters();
  CHECK(s.pack_reads == 3 + 2 + 1 + 3);  // 1 2 3, 4 5, 6, 10 11 12; never 13 or 8
}

TEST_CASE("cache: a layer streamed again while the slots hold its own later experts") {
  // The slots end a pass holding the last experts of the layer; the next pass
  // asks for them last. Pinning them at once (they are hits) would leave no
  // slot for the first expert, and the request would wait for itself.
  Fixture f(1, 24, 4);
  auto c = f.make(6);
  std::vector<uint32_t> ids(24);
  std::iota(ids.begin(), ids.end(), 0u);
  for (int round = 0; round < 3; ++round)
    CHECK(test::stream_layer_deferred(*c, *f.dev, 0, ids, kObj) == 0);
  auto s = c->counters();
  CHECK(s.cache_hits + s.cache_misses == 3 * 24);
  CHECK(s.cache_misses == 3 * 24);  // each pass evicts what it would use last
  CHECK(s.io_errors == 0);
}

TEST_CASE("cache: two threads stream whole layers through few slots with deferred acquires") {
  Fixture f(2, 24, 4);
  auto c = f.make(6);
  CHECK(test::stream_layers_concurrently(*c, *f.dev, 2, 24, 3, kObj) == 0);
  auto s = c->counters();
  CHECK(s.cache_hits + s.cache_misses == 2 * 3 * 24);
  CHECK(s.io_errors == 0);
}

TEST_CASE("cache: protected experts are never evicted; too many protected is an error") {
  Fixture f(1, 16, 2);
  auto c = make_cache(f, 3, PolicyKind::kLru);
  auto held = acquire_ok(*c, 0, {0, 1});
  REQUIRE(c->wait_all(held.ticket).ok());
  auto b = acquire_ok(*c, 0, {2});
  REQUIRE(c->wait_all(b.ticket).ok());
  // Two new experts but only one slot is unprotected (2 is still held): refused.
  std::vector<uint32_t> two = {3, 4};
  auto full = c->acquire(0, two.data(), 2);
  REQUIRE_FALSE(full.ok());
  CHECK(full.error().code == XPACK_E_CAPACITY);
  REQUIRE(c->release(b.ticket).ok());
  // 0 and 1 are LRU-older than 2, yet protected: 3 must take 2's slot.
  for (uint32_t e = 3; e < 8; ++e) {
    auto a = acquire_ok(*c, 0, {e});
    CHECK(a.experts[0].slot == b.experts[0].slot);
    REQUIRE(c->wait_all(a.ticket).ok());
    REQUIRE(c->release(a.ticket).ok());
  }
  for (auto& h : held.experts) check_slot_bytes(*f.dev, h, 0);
  REQUIRE(c->release(held.ticket).ok());
  CHECK(c->release(held.ticket).error().code == XPACK_E_INVALID_ARG);  // twice
  // Bad arguments.
  uint32_t bad = 16;
  CHECK(c->acquire(0, &bad, 1).error().code == XPACK_E_INVALID_ARG);
  CHECK(c->acquire(1, two.data(), 2).error().code == XPACK_E_INVALID_ARG);
  CHECK(c->acquire(0, nullptr, 0).error().code == XPACK_E_INVALID_ARG);
  std::vector<uint32_t> four = {8, 9, 10, 11};
  CHECK(c->acquire(0, four.data(), 4).error().code == XPACK_E_CAPACITY);
  CHECK(c->wait(12345, 0).error().code == XPACK_E_INVALID_ARG);
}

TEST_CASE("cache: acquire returns before the copies finish; hits are ready at once") {
  device::HostDeviceOptions d;
  d.copy_bytes_per_second = 20'000'000;  // 10 KB copy = 0.5 ms
  Fixture f(1, 16, 2, d);
  auto c = f.make(8);
  auto a = acquire_ok(*c, 0, {1, 2, 3, 4});
  for (auto& h : a.experts) CHECK_FALSE(h.hit);
  // Duplicates share one slot and count once.
  auto dup = acquire_ok(*c, 0, {1, 1, 2}, 2);
  CHECK(dup.experts[0].slot == dup.experts[1].slot);
  CHECK(dup.experts[0].hit);
  REQUIRE(c->wait_all(a.ticket).ok());
  REQUIRE(c->wait_all(dup.ticket).ok());
  for (auto& h : a.experts) {
    CHECK(*h.ready->query());
    check_slot_bytes(*f.dev, h, 0);
  }
  REQUIRE(c->release(a.ticket).ok());
  REQUIRE(c->release(dup.ticket).ok());
  auto s = c->counters();
  CHECK(s.cache_hits == 2);
  CHECK(s.cache_misses == 4);
  CHECK(s.route_tokens_by_layer[0] == 3);
  CHECK(s.stall_waits >= 1);
  CHECK(s.read_latency.count() == 4);
}

TEST_CASE("cache: an injected read error fails that expert only, and the cache recovers") {
  Fixture f(1, 16, 2);
  io::FaultPlan plan;
  plan.completions.push_back({make_key(0, 5), -1, EIO, 0, 1});
  CacheOptions o;
  o.faults = &plan;
  auto c = f.make(4, o);
  auto a = acquire_ok(*c, 0, {5, 6});
  auto e5 = c->wait(a.ticket, 0);
  REQUIRE_FALSE(e5.ok());
  CHECK(e5.error().code == -EIO);
  CHECK(c->wait(a.ticket, 1).ok());
  check_slot_bytes(*f.dev, a.experts[1], 0);
  CHECK(c->wait_all(a.ticket).error().code == -EIO);
  auto s = c->counters();
  CHECK(s.io_errors == 1);
  CHECK(s.pack_reads == 1);
  // A concurrent request of the failed expert sees the same failure.
  auto again = acquire_ok(*c, 0, {5});
  CHECK(c->wait_all(again.ticket).error().code == -EIO);
  REQUIRE(c->release(again.ticket).ok());
  REQUIRE(c->release(a.ticket).ok());
  // After release the failed entry is gone: the next request reloads it.
  auto b = acquire_ok(*c, 0, {5});
  CHECK_FALSE(b.experts[0].hit);
  REQUIRE(c->wait_all(b.ticket).ok());
  check_slot_bytes(*f.dev, b.experts[0], 0);
  REQUIRE(c->release(b.ticket).ok());
  CHECK(c->counters().io_errors == 1);
}

TEST_CASE("cache: verification rejects an object whose checksum does not match") {
  Fixture f(1, 16, 2);
  auto good = f.src.checksum;
  f.src.checksum = [good](uint32_t l, uint32_t e) { return e == 3 ? good(l, e) ^ 1 : good(l, e); };
  CacheOptions o;
  o.verify = true;
  auto c = f.make(4, o);
  auto a = acquire_ok(*c, 0, {3, 4});
  CHECK(c->wait(a.ticket, 0).error().code == XPACK_E_OBJECT_CHECKSUM);
  CHECK(c->wait(a.ticket, 1).ok());
  REQUIRE(c->release(a.ticket).ok());
  CHECK(c->counters().io_errors == 1);
  CHECK(c->counters().h2d_bytes == kObj);  // the bad object was never delivered (nor counted)
}

TEST_CASE("cache: prefetch fills free slots, counts used and wasted, never evicts protected") {
  Fixture f(1, 16, 1);
  auto c = make_cache(f, 3, PolicyKind::kLru);
  std::vector<uint32_t> hint = {1, 2};
  auto n = c->prefetch(0, hint.data(), 2);
  REQUIRE(n.ok());
  CHECK(*n == 2);
  auto a = acquire_ok(*c, 0, {1});
  CHECK(a.experts[0].hit);
  REQUIRE(c->wait_all(a.ticket).ok());
  check_slot_bytes(*f.dev, a.experts[0], 0);
  // Hold 1; fill the last slot with 3, hold it; a hint now may only displace 2.
  auto b = acquire_ok(*c, 0, {3});
  REQUIRE(c->wait_all(b.ticket).ok());
  // A slot whose read is in flight is protected whatever its hint says, so 2's
  // read is waited for (on a loaded machine it can outlast 3's): what is tested
  // is which keys a hint may displace, not how fast the reads are.
  for (int i = 0; i < 5000 && c->counters().pack_reads < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(c->counters().pack_reads == 3);
  std::vector<uint32_t> hint2 = {7, 8};
  n = c->prefetch(0, hint2.data(), 2);
  REQUIRE(n.ok());
  CHECK(*n == 1);  // 7 replaces the unused prefetch of 2; 8 finds nothing evictable
  REQUIRE(c->release(a.ticket).ok());
  REQUIRE(c->release(b.ticket).ok());
  auto s = c->counters();
  CHECK(s.prefetch_issued == 3);
  CHECK(s.prefetch_used == 1);
  CHECK(s.prefetch_wasted == 1);
  CHECK(s.cache_misses == 1);  // only 3
  auto d = acquire_ok(*c, 0, {7});
  CHECK(d.experts[0].hit);
  REQUIRE(c->wait_all(d.ticket).ok());
  check_slot_bytes(*f.dev, d.experts[0], 0);
  REQUIRE(c->release(d.ticket).ok());
}

// One staging buffer and a slow copy (10000 B at 50 kB/s = 200 ms) keep a later
// prefetch queued, not started, long enough to act on it.
Fixture slow_copy_fixture() {
  device::HostDeviceOptions d;
  d.copy_bytes_per_second = 50000;
  return Fixture(1, 16, 1, d);
}

// A cache of `slots` slots over slow_copy_fixture(), LRU, with that one staging buffer.
std::unique_ptr<ExpertCache> make_one_staging_cache(Fixture& f, uint32_t slots) {
  CacheOptions o;
  o.policy = PolicyKind::kLru;
  o.staging_slots = 1;
  return f.make(slots, o);
}

// A hit on an expert still being read is a hit whose ready event is not yet
// recorded for it (a compute stream waiting on it then would wait for nothing):
// only xpack_cache_wait covers it; once published, the recorded event does.
TEST_CASE("cache: a hit on a prefetch in flight has no recorded ready event until its copy is enqueued") {
  auto f = slow_copy_fixture();
  auto c = f.make(4);
  std::vector<uint32_t> hint = {1, 2};
  REQUIRE(c->prefetch(0, hint.data(), 2).ok());
  // 2's read waits for the one staging buffer, which 1's 200 ms copy holds.
  auto a = acquire_ok(*c, 0, {2});
  CHECK(a.experts[0].hit);
  CHECK_FALSE(a.experts[0].ready_recorded);
  REQUIRE(c->wait(a.ticket, 0).ok());
  auto e = c->entry(a.ticket, 0);
  REQUIRE(e.ok());
  CHECK(e->ready_recorded);
  check_slot_bytes(*f.dev, *e, 0);
  // 1 was published long ago: its recorded event alone covers its bytes.
  auto b = acquire_ok(*c, 0, {1});
  CHECK(b.experts[0].hit);
  REQUIRE(b.experts[0].ready_recorded);
  REQUIRE(b.experts[0].ready->wait().ok());
  check_slot_bytes(*f.dev, b.experts[0], 0);
  REQUIRE(c->release(a.ticket).ok());
  REQUIRE(c->release(b.ticket).ok());
}

TEST_CASE("cache: a demand miss may take the slot of a prefetch that has not started") {
  auto f = slow_copy_fixture();
  auto c = make_one_staging_cache(f, 2);
  auto a = acquire_ok(*c, 0, {1});        // takes the only staging buffer
  std::vector<uint32_t> hint = {2};
  REQUIRE(c->prefetch(0, hint.data(), 1).ok());  // queued behind it
  // Slot 0 holds 1 (protected), slot 1 the queued guess 2: the demand for 3
  // overrules the guess instead of failing with XPACK_E_CAPACITY.
  auto b = c->acquire(0, std::vector<uint32_t>{3}.data(), 1);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
  REQUIRE(c->wait_all(a.ticket).ok());
  REQUIRE(c->wait_all(b->ticket).ok());
  check_slot_bytes(*f.dev, a.experts[0], 0);
  check_slot_bytes(*f.dev, b->experts[0], 0);
  auto s = c->counters();
  CHECK(s.prefetch_issued == 1);
  CHECK(s.prefetch_wasted == 1);
  CHECK(s.cache_evictions == 1);
  CHECK(s.pack_reads == 2);  // the cancelled guess was never read
  REQUIRE(c->release(a.ticket).ok());
  REQUIRE(c->release(b->ticket).ok());
  // A prefetch may not overrule another prefetch of the same hint.
  std::vector<uint32_t> hint2 = {4, 5};
  auto held = acquire_ok(*c, 0, {6});     // staging busy again for 200 ms
  auto n = c->prefetch(0, hint2.data(), 2);
  REQUIRE(n.ok());
  CHECK(*n == 1);
  REQUIRE(c->wait_all(held.ticket).ok());
  REQUIRE(c->release(held.ticket).ok());
}

TEST_CASE("cache: an acquired queued prefetch becomes a demand load; stale guesses expire") {
  auto f = slow_copy_fixture();
  auto c = make_one_staging_cache(f, 4);
  auto a = acquire_ok(*c, 0, {1});
  std::vector<uint32_t> hint = {2, 3};
  REQUIRE(c->prefetch(0, hint.data(), 2).ok());
  REQUIRE(c->release(a.ticket).ok());
  // Next step: 2 is wanted (a hit on a queued load: it is promoted, and read
  // before 3 even though 3 was queued first).
  auto b = acquire_ok(*c, 0, {2});
  CHECK(b.experts[0].hit);
  REQUIRE(c->release(b.ticket).ok());
  // Two more steps pass before the staging buffer frees: 3 is a stale guess.
  auto d = acquire_ok(*c, 0, {1});
  REQUIRE(c->release(d.ticket).ok());
  auto e = acquire_ok(*c, 0, {2});
  REQUIRE(c->wait_all(e.ticket).ok());
  check_slot_bytes(*f.dev, e.experts[0], 0);
  REQUIRE(c->release(e.ticket).ok());
  auto s = c->counters();
  CHECK(s.prefetch_issued == 2);
  CHECK(s.prefetch_used == 1);
  CHECK(s.prefetch_wasted == 1);
  CHECK(s.pack_reads == 2);  // 1 and 2; 3 expired before it was read
  auto g = acquire_ok(*c, 0, {3});
  CHECK_FALSE(g.experts[0].hit);  // it was dropped, not kept as a loading entry
  REQUIRE(c->wait_all(g.ticket).ok());
  check_slot_bytes(*f.dev, g.experts[0], 0);
  REQUIRE(c->release(g.ticket).ok());
}

// A policy that values keys by their history refuses a guess of a key it has
// not seen, but a certain hint (deepseek4's hash layers, issued at a token's
// start for a layer the same step acquires) is a fact. The hybrid ranks by use
// count, so without the protection the hinted keys (count 0) would be the
// first victims of every miss below.
TEST_CASE("cache: a certain hint displaces what a guess may not, and is protected until acquired or the next step ends") {
  Fixture f(2, 16, 1);
  auto c = make_cache(f, 4, PolicyKind::kHybrid);
  auto use = [&](uint32_t layer, std::vector<uint32_t> ids) { return use_all(*c, layer, std::move(ids)); };
  // A slot whose read is in flight is protected whatever its hint says, so each
  // hint's reads are waited for: the protection alone is what is tested.
  auto hinted = [&](uint32_t layer, std::vector<uint32_t> ids) {
    const uint64_t before = c->counters().pack_reads;
    auto n = c->prefetch(layer, ids.data(), ids.size(), /*certain=*/true);
    REQUIRE(n.ok());
    for (int i = 0; i < 5000 && c->counters().pack_reads < before + *n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(c->counters().pack_reads == before + *n);
    return *n;
  };
  for (int round = 0; round < 3; ++round)
    for (uint32_t e = 1; e <= 4; ++e) use(0, {e});  // four valued keys (count 3) fill the cache
  std::vector<uint32_t> hint = {5, 6, 7};
  auto n = c->prefetch(1, hint.data(), 3);
  REQUIRE(n.ok());
  CHECK(*n == 0);  // a guess: nothing it may displace
  CHECK(hinted(1, hint) == 2);  // at most half of the 4 slots: 5 and 6; 7 is left to its acquire
  // The next step: layer 0 misses first, then layer 1 acquires the hinted experts.
  CHECK_FALSE(use(0, {8}));
  CHECK(use(1, {5, 6}));
  auto s = c->counters();
  CHECK(s.prefetch_issued == 2);
  CHECK(s.prefetch_used == 2);
  CHECK(s.prefetch_wasted == 0);

  // Protected through the step after the hint's, and not beyond: hint 9, then
  // a miss in the next step (it must not take 9), a hit on 9; hint 12, a miss in
  // the next step, a miss in the one after (12 is unprotected and least used
  // by then: it goes), and 12 is read again.
  REQUIRE(hinted(1, {9}) == 1);
  CHECK_FALSE(use(0, {10}));
  CHECK(use(1, {9}));
  REQUIRE(hinted(1, {12}) == 1);
  CHECK_FALSE(use(0, {13}));
  CHECK_FALSE(use(0, {14}));
  CHECK_FALSE(use(1, {12}));
  s = c->counters();
  CHECK(s.prefetch_issued == 4);
  CHECK(s.prefetch_used == 3);
  CHECK(s.prefetch_wasted == 1);
}

TEST_CASE("cache: a certain hint of a resident key protects it from the misses before its acquire") {
  Fixture f(2, 16, 1);
  auto c = make_cache(f, 4, PolicyKind::kHybrid);
  auto use = [&](uint32_t layer, uint32_t e) { return use_all(*c, layer, {e}); };
  for (int round = 0; round < 3; ++round)
    for (uint32_t e = 1; e <= 3; ++e) use(0, e);
  use(1, 4);  // resident, used once: the hybrid's first victim
  std::vector<uint32_t> four = {4};
  auto n = c->prefetch(1, four.data(), 1, true);
  REQUIRE(n.ok());
  CHECK(*n == 0);  // nothing to load
  CHECK_FALSE(use(0, 5));  // evicts a key used three times instead
  CHECK(use(1, 4));
  // Without the hint, the same sequence evicts 4.
  use(0, 5);
  CHECK_FALSE(use(0, 6));
  CHECK_FALSE(use(1, 4));
}

TEST_CASE("cache: stats JSON every N releases and at close; routing trace replays") {
  Fixture f(2, 16, 2);
  CacheOptions o;
  o.stats_path = (f.dir / "stats.json").string();
  o.stats_interval = 2;
  o.trace_path = (f.dir / "trace.csv").string();
  {
    auto c = f.make(6, o);
    auto a = acquire_ok(*c, 0, {1, 2});
    REQUIRE(c->release(a.ticket).ok());
    CHECK_FALSE(std::filesystem::exists(o.stats_path));
    auto b = acquire_ok(*c, 1, {1, 2});
    REQUIRE(c->release(b.ticket).ok());
    REQUIRE(std::filesystem::exists(o.stats_path));
    auto j = nlohmann::json::parse(test::read_file(o.stats_path));
    CHECK(j["steps"] == 2);
    CHECK(j["cache_misses"] == 4);
    auto d = acquire_ok(*c, 0, {2, 3});  // new step (layer went back to 0)
    REQUIRE(c->wait_all(d.ticket).ok());
    REQUIRE(c->release(d.ticket).ok());
  }
  auto j = nlohmann::json::parse(test::read_file(o.stats_path));
  CHECK(j["steps"] == 3);
  CHECK(j["cache_hits"] == 1);
  CHECK(j["cache_capacity_experts"] == 6);
  CHECK(j["route_calls_by_layer"][0] == 2);
  auto trace = stats::read_routing_trace(o.trace_path);
  REQUIRE(trace.ok());
  REQUIRE(trace->size() == 6);
  CHECK((*trace)[4].step == 1);
  CHECK((*trace)[5].expert == 3);
  ReplayOptions ro;
  ro.capacity = 6;
  auto sim = replay_trace(*trace, ro);
  REQUIRE(sim.ok());
  CHECK(sim->hits == 1);
  CHECK(sim->misses == 5);
}

TEST_CASE("cache: concurrent acquire / wait / release from several threads") {
  Fixture f(2, 32, 4);
  CacheOptions o;
  o.staging_slots = 4;
  o.read_splits = 2;
  auto c = f.make(24, o);
  constexpr int kThreads = 4, kIters = 60;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng(t * 7919 + 1);
      for (int i = 0; i < kIters; ++i) {
        uint32_t layer = rng() % 2;
        std::vector<uint32_t> ids;
        for (int k = 0; k < 4; ++k) ids.push_back(rng() % 12 + (rng() % 4 == 0 ? 12 : 0));
        auto a = c->acquire(layer, ids.data(), ids.size(), 1);
        if (!a.ok()) {  // all slots protected by other threads: legal, retry later
          if (a.error().code != XPACK_E_CAPACITY) ++failures;
          continue;
        }
        if (!c->wait_all(a->ticket).ok()) ++failures;
        for (auto& h : a->experts) {
          std::vector<uint8_t> got(kObj);
          if (!f.dev->copy_to_host(got.data(), h.data, kObj).ok() ||
              got != expected_object(layer, h.expert, kObj))
            ++failures;
        }
        if (!c->release(a->ticket).ok()) ++failures;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(failures == 0);
  auto s = c->counters();
  CHECK(s.io_errors == 0);
  CHECK(s.pack_reads == s.cache_misses);
  CHECK(s.acquires == s.steps);
}

TEST_CASE("cache: ssd_busy_ns is the time reads were in flight, bounded by the wall clock") {
  Fixture f(2, 16, 2);
  auto c = f.make(32);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t layer = 0; layer < 2; ++layer)
    for (uint32_t e = 0; e < 16; e += 2) {
      auto a = acquire_ok(*c, layer, {e, e + 1});
      REQUIRE(c->wait_all(a.ticket).ok());
      REQUIRE(c->release(a.ticket).ok());
    }
  const uint64_t wall = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - t0).count());
  auto s = c->counters();
  CHECK(s.pack_reads == 32);
  CHECK(s.ssd_busy_ns > 0);
  CHECK(s.ssd_busy_ns <= wall);
  // Each busy instant has a read in flight, inside that read's latency interval.
  CHECK(s.ssd_busy_ns <= s.read_latency.sum_ns());
  // Hits read nothing: the busy time stays where it was once the last read landed
  // (the I/O thread closes the stretch just after publishing that read: wait
  // until two readings 10 ms apart agree, at most 2 s, for slow sanitizer runs).
  auto settled = c->counters().ssd_busy_ns;
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const uint64_t again = c->counters().ssd_busy_ns;
    if (again == settled) break;
    settled = again;
  }
  for (int i = 0; i < 20; ++i) {
    auto a = acquire_ok(*c, 1, {3});
    REQUIRE(c->release(a.ticket).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(c->counters().ssd_busy_ns == settled);
}
