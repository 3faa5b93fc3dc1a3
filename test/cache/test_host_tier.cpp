// The host tier (cache/host_tier.h): its bookkeeping alone, then the cache with
// a tier on the host device: bytes after demotion and promotion (also with
// slow, observably asynchronous copies), counters equal to xpack-sim's
// two-level replay, no read for a host hit, prefetch, verification, sizing and
// bad options, and several threads at once (run under TSan with the suite).
#include <doctest/doctest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "cache/expert_cache.h"
#include "cache/host_tier.h"
#include "cache/replay.h"
#include "cache/sizing.h"
#include "object_file.h"

using namespace xpack;
using namespace xpack::cache;
using xpack::test::expected_object;

namespace {

using Fixture = test::CacheFixture;
constexpr uint64_t kObj = Fixture::kObj;
constexpr uint64_t kStride = Fixture::kStride;
constexpr uint64_t kFrame = Fixture::kFrame;

// One single-expert request: waits, checks the slot's bytes, releases.
// Returns whether it was a device hit.
bool request(Fixture& f, ExpertCache& c, uint32_t layer, uint32_t expert) {
  auto a = c.acquire(layer, &expert, 1, 1);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  REQUIRE(c.wait_all(a->ticket).ok());
  std::vector<uint8_t> got(kObj);
  REQUIRE(f.dev->copy_to_host(got.data(), a->experts[0].data, kObj).ok());
  CHECK_MESSAGE(got == expected_object(layer, expert, kObj), "layer " << layer << " expert " << expert);
  bool hit = a->experts[0].hit;
  REQUIRE(c.release(a->ticket).ok());
  return hit;
}

}  // namespace

TEST_CASE("host tier: admit, take, oldest out first, one frame always spare") {
  HostTier t(3);
  CHECK(t.frame_count() == 3);
  CHECK(t.capacity() == 2);
  auto a = t.admit(make_key(0, 1));
  auto b = t.admit(make_key(0, 2));
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->frame != b->frame);
  CHECK_FALSE(a->evicted);
  CHECK_FALSE(t.admit(make_key(0, 1)));  // already held
  // At capacity: the oldest (1) goes; its frame becomes the spare, and the
  // spare that existed takes 3.
  auto c = t.admit(make_key(0, 3));
  REQUIRE(c);
  CHECK(c->evicted == make_key(0, 1));
  CHECK(c->frame != b->frame);
  CHECK_FALSE(t.holds(make_key(0, 1)));
  CHECK(t.held_count() == 2);
  // A swap: 2 leaves (its frame taken until given back) and a victim enters
  // without dropping anything, into a frame other than 2's.
  auto f2 = t.take(make_key(0, 2));
  REQUIRE(f2);
  CHECK(*f2 == b->frame);
  CHECK_FALSE(t.take(make_key(0, 2)));
  auto d = t.admit(make_key(0, 4));
  REQUIRE(d);
  CHECK_FALSE(d->evicted);
  CHECK(d->frame != *f2);
  CHECK(d->frame != c->frame);
  t.give_back(*f2);
  CHECK(t.held_count() == 2);  // 3 and 4
  auto e = t.admit(make_key(0, 5));
  REQUIRE(e);
  CHECK(e->evicted == make_key(0, 3));
  t.drop(make_key(0, 5));
  CHECK_FALSE(t.holds(make_key(0, 5)));
  CHECK(t.held_count() == 1);
  // Fewer than two frames hold nothing.
  for (uint32_t n : {0u, 1u}) {
    HostTier none(n);
    CHECK(none.capacity() == 0);
    CHECK_FALSE(none.admit(make_key(0, 1)));
    CHECK_FALSE(none.take(make_key(0, 1)));
  }
}

TEST_CASE("host tier: a victim cache behind the slots, byte-exact, equal to the replay") {
  // 2 slots + 3 frames under LRU: the 5 most recent experts need no read.
  std::vector<uint32_t> seq = {1, 2, 3, 4, 5, 1, 2, 6, 1, 7, 3, 4, 5, 1, 2, 2, 8};
  for (bool slow : {false, true}) {
    device::HostDeviceOptions d;
    // Slow copies (1 ms each) keep demotions and promotions in flight while the
    // next request reuses their slots and frames.
    if (slow) d.copy_bytes_per_second = kObj * 1000;
    Fixture f(1, 16, 1, d);
    CacheOptions o;
    o.policy = PolicyKind::kLru;
    auto c = f.make_tiered(2, 4, o);
    std::vector<stats::TraceRecord> trace;
    for (size_t i = 0; i < seq.size(); ++i) {
      request(f, *c, 0, seq[i]);
      trace.push_back({i, 0, seq[i]});
    }
    ReplayOptions ro;
    ro.capacity = 2;
    ro.host_capacity = 4;
    ro.policy = PolicyKind::kLru;
    auto sim = replay_trace(trace, ro);
    REQUIRE(sim.ok());
    auto s = c->counters();
    CAPTURE(slow);
    CHECK(s.cache_hits == sim->hits);
    CHECK(s.cache_misses == sim->misses);
    CHECK(s.cache_evictions == sim->evictions);
    CHECK(s.host_hits == sim->host_hits);
    CHECK(s.host_demotions == sim->host_demotions);
    CHECK(s.host_evictions == sim->host_evictions);
    // Walked by hand: every miss after the first two evicts and demotes (14);
    // the tier is full from the 8th request on and drops its oldest 7 times;
    // 1, 2, 1 and 1 come back from it; only the second 2 is a device hit.
    CHECK(s.cache_hits == 1);
    CHECK(s.host_hits == 4);
    CHECK(s.pack_reads == 12);
    CHECK(s.host_demotions == 14);
    CHECK(s.host_evictions == 7);
    CHECK(s.pack_reads == s.cache_misses - s.host_hits);
    CHECK(s.d2h_bytes == s.host_demotions * kObj);
    CHECK(s.h2d_bytes == s.cache_misses * kObj);
    CHECK(s.io_errors == 0);
    // Without the tier the same trace reads every miss.
    ReplayOptions no_tier = ro;
    no_tier.host_capacity = 0;
    auto flat = replay_trace(trace, no_tier);
    REQUIRE(flat.ok());
    CHECK(flat->hits == sim->hits);
    CHECK(flat->host_hits == 0);
    CHECK(sim->hit_rate_with_host() > flat->hit_rate());
  }
}

TEST_CASE("host tier: a prefetch of a key the tier holds copies it up without a read") {
  Fixture f(1, 16, 1);
  CacheOptions o;
  o.policy = PolicyKind::kLru;
  auto c = f.make_tiered(2, 4, o);
  for (uint32_t e : {1, 2, 3, 4}) request(f, *c, 0, e);  // 1 and 2 demoted
  auto before = c->counters();
  CHECK(before.host_demotions == 2);
  // Two free-able slots? Both hold unprotected keys 3 and 4; the LRU policy lets
  // a hint displace the older one (3), which is demoted in turn.
  std::vector<uint32_t> hint = {1};
  auto n = c->prefetch(0, hint.data(), 1);
  REQUIRE(n.ok());
  CHECK(*n == 1);
  CHECK(request(f, *c, 0, 1));  // a device hit now
  auto s = c->counters();
  CHECK(s.pack_reads == before.pack_reads);
  CHECK(s.host_hits == before.host_hits + 1);
  CHECK(s.prefetch_used == 1);
  CHECK(s.host_demotions == 3);
  CHECK_FALSE(request(f, *c, 0, 3));  // back from the tier, byte-exact
  CHECK(c->counters().pack_reads == before.pack_reads);
}

TEST_CASE("host tier: with verification, demoted bytes come back exact") {
  Fixture f(2, 8, 2);
  CacheOptions o;
  o.verify = true;
  auto c = f.make_tiered(3, 6, o);
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) request(f, *c, rng() % 2, rng() % 8);
  auto s = c->counters();
  CHECK(s.io_errors == 0);
  CHECK(s.host_hits > 0);
  CHECK(s.pack_reads == s.cache_misses - s.host_hits);
}

TEST_CASE("host tier: sizing, caps and refusals") {
  Fixture f(2, 16, 2);
  CacheOptions o;
  o.budget_bytes = 4 * kStride;
  // Fewer than two frames asked for: refused, not silently dropped.
  o.host_cache_bytes = 2 * kFrame - 1;
  auto bad = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == XPACK_E_INVALID_ARG);
  CHECK(bad.error().message.find("fewer than 2") != std::string::npos);
  // Whole frames only; never more than the objects the slots cannot hold.
  o.host_cache_bytes = 5 * kFrame + kFrame - 1;
  auto c = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE(c.ok());
  CHECK((*c)->host_frame_count() == 5);
  CHECK((*c)->host_frame_stride() == kFrame);
  c->reset();
  o.host_cache_bytes = 1000 * kFrame;
  c = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE(c.ok());
  CHECK((*c)->host_frame_count() == 32 - 4 + 1);
  c->reset();
  // Slots for every object: a tier would hold nothing the device does not.
  o.budget_bytes = 32 * kStride;
  o.host_cache_bytes = 10 * kFrame;
  c = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE(c.ok());
  CHECK((*c)->host_frame_count() == 0);
  o.budget_bytes = 4 * kStride;
  c->reset();
  o.host_cache_bytes = 0;
  c = ExpertCache::create(f.src, *f.dev, o);
  REQUIRE(c.ok());
  CHECK((*c)->host_frame_count() == 0);
  // The replay refuses a tier beyond 32-bit frame indices.
  ReplayOptions ro;
  ro.capacity = 2;
  ro.host_capacity = uint64_t(UINT32_MAX) + 1;
  CHECK_FALSE(replay_trace({{0, 0, 1}}, ro).ok());
}

TEST_CASE("host tier: stats JSON names both tiers") {
  Fixture f(1, 16, 1);
  CacheOptions o;
  o.policy = PolicyKind::kLru;
  o.stats_path = (f.dir / "stats.json").string();
  {
    auto c = f.make_tiered(2, 3, o);
    for (uint32_t e : {1, 2, 3, 1}) request(f, *c, 0, e);
  }
  auto j = nlohmann::json::parse(test::read_file(o.stats_path));
  CHECK(j["host_capacity_experts"] == 2);
  CHECK(j["host_frames"] == 3);
  CHECK(j["host_capacity_bytes"] == 3 * kFrame);
  CHECK(j["host_hits"] == 1);
  CHECK(j["host_demotions"] == 2);
  CHECK(j["host_resident_experts"] == 1);  // 2 (1 went back up)
  CHECK(j["d2h_bytes"] == 2 * kObj);
  CHECK(j["hit_rate_with_host"].get<double>() == doctest::Approx(0.25));
  CHECK(j["hit_rate"].get<double>() == doctest::Approx(0.0));
}

TEST_CASE("host tier: several threads acquire, wait and release through both tiers") {
  device::HostDeviceOptions d;
  d.copy_bytes_per_second = uint64_t(kObj) * 20000;  // copies stay in flight a little
  Fixture f(2, 32, 4, d);
  CacheOptions o;
  o.staging_slots = 3;
  auto c = f.make_tiered(12, 20, o);
  // Three random experts of 20 per request, two layers: more than both tiers hold.
  int failures = test::random_requests_concurrently(*c, *f.dev, 4, 80, 2, 20, 3, kObj, 104729);
  CHECK(failures == 0);
  auto s = c->counters();
  CHECK(s.io_errors == 0);
  CHECK(s.host_hits > 0);
  CHECK(s.pack_reads == s.cache_misses - s.host_hits);
}
