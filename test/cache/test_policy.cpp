// Eviction policies and the replay against hand-computed sequences.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/replay.h"
#include "cache/slot_directory.h"

using namespace xpack;
using namespace xpack::cache;
using xpack::stats::TraceRecord;

namespace {

// One group per element: step i, layer 0, the given expert.
std::vector<TraceRecord> decode_trace(const std::vector<uint32_t>& experts) {
  std::vector<TraceRecord> t;
  for (size_t i = 0; i < experts.size(); ++i) t.push_back({i, 0, experts[i]});
  return t;
}

ReplayResult run(const std::vector<TraceRecord>& t, uint64_t cap, PolicyKind p, uint32_t k = 0) {
  ReplayOptions o;
  o.capacity = cap;
  o.policy = p;
  o.top_k = k;
  auto r = replay_trace(t, o);
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("policy names parse and print") {
  CHECK(*parse_policy("lru") == PolicyKind::kLru);
  CHECK(*parse_policy("lfu") == PolicyKind::kLfu);
  CHECK(*parse_policy("hybrid") == PolicyKind::kHybrid);
  CHECK(*parse_policy("belady") == PolicyKind::kBelady);
  CHECK(*parse_policy("decay") == PolicyKind::kDecay);
  CHECK(*parse_policy("lrfu") == PolicyKind::kDecay);
  CHECK(*parse_policy("adaptive") == PolicyKind::kAdaptive);
  CHECK(*parse_policy("oracle-lfu") == PolicyKind::kOracleLfu);
  CHECK(std::string(policy_name(PolicyKind::kOracleLfu)) == "oracle-lfu");
  CHECK(is_offline(PolicyKind::kOracleLfu));
  CHECK(is_offline(PolicyKind::kBelady));
  CHECK_FALSE(is_offline(PolicyKind::kAdaptive));
  CHECK(std::string(policy_name(PolicyKind::kAdaptive)) == "adaptive");
  CHECK(std::string(policy_name(PolicyKind::kDecay)) == "decay");
  CHECK(parse_policy("").error().code == XPACK_E_INVALID_ARG);
  CHECK(parse_policy("fifo").error().code == XPACK_E_INVALID_ARG);
  CHECK(std::string(policy_name(PolicyKind::kHybrid)) == "hybrid");
}

TEST_CASE("sequence 1 2 3 1 4 2 5 1 2 3, capacity 3") {
  auto t = decode_trace({1, 2, 3, 1, 4, 2, 5, 1, 2, 3});
  // LRU: hits at the 2nd 1 and the 3rd 2 (see doc/cache.md for the walk-through).
  auto lru = run(t, 3, PolicyKind::kLru);
  CHECK(lru.hits == 2);
  CHECK(lru.misses == 8);
  CHECK(lru.evictions == 5);
  auto lfu = run(t, 3, PolicyKind::kLfu);
  CHECK(lfu.hits == 3);
  CHECK(lfu.misses == 7);
  auto hyb = run(t, 3, PolicyKind::kHybrid);
  CHECK(hyb.hits == 3);
  CHECK(hyb.misses == 7);
  auto min = run(t, 3, PolicyKind::kBelady);
  // MIN: 1,2,3 miss; 1 hit; 4 evicts 3 (next use last); 2 hit; 5 evicts 4 (never);
  // 1 hit; 2 hit; 3 miss.
  CHECK(min.hits == 4);
  CHECK(min.misses == 6);
}

TEST_CASE("sequence 1 2 1 3 2 4 2, capacity 2: the hybrid's count survives eviction") {
  auto t = decode_trace({1, 2, 1, 3, 2, 4, 2});
  CHECK(run(t, 2, PolicyKind::kLru).hits == 2);     // 1, last 2
  CHECK(run(t, 2, PolicyKind::kLfu).hits == 1);     // only the second 1
  CHECK(run(t, 2, PolicyKind::kHybrid).hits == 2);  // 2 comes back with count 2, keeps its slot
  CHECK(run(t, 2, PolicyKind::kBelady).hits == 3);
}

// Key 1 is requested every third time among pairs that never come back soon: LRU
// keeps evicting it, the oracle LFU (counts of the whole trace: 1 five times, the
// others twice) keeps it and lets the second slot churn.
TEST_CASE("sequence 1 2 3 1 2 3 1 4 5 1 4 5 1, capacity 2: the oracle LFU keeps the trace's most requested key") {
  auto t = decode_trace({1, 2, 3, 1, 2, 3, 1, 4, 5, 1, 4, 5, 1});
  CHECK(run(t, 2, PolicyKind::kLru).hits == 0);
  CHECK(run(t, 2, PolicyKind::kLfu).hits == 0);  // counts restart on re-entry: 1 never builds one
  auto oracle = run(t, 2, PolicyKind::kOracleLfu);
  CHECK(oracle.hits == 4);  // every request of 1 after the first
  CHECK(oracle.misses == 9);
  CHECK(run(t, 2, PolicyKind::kBelady).hits >= oracle.hits);
}

TEST_CASE("hybrid: victim choice step by step") {
  SlotDirectory dir(2, make_hybrid_policy());
  auto none = [](Key) { return false; };
  auto req = [&](uint32_t e) {
    Key k = make_key(0, e);
    dir.policy().on_request(k);
    if (dir.find(k)) {
      dir.policy().on_hit(k);
      return std::optional<Key>();
    }
    auto p = dir.place(k, Phase::kDecode, none);
    REQUIRE(p.has_value());
    return p->evicted;
  };
  CHECK_FALSE(req(1).has_value());
  CHECK_FALSE(req(2).has_value());
  CHECK(*dir.find(make_key(0, 1)) == 0);  // first empty slot first
  CHECK(*dir.find(make_key(0, 2)) == 1);
  req(1);                                   // hit, f1 = 2
  CHECK(req(3) == make_key(0, 2));          // f2 = 1 < f1
  CHECK(*dir.find(make_key(0, 3)) == 1);    // takes the freed slot
  CHECK(req(2) == make_key(0, 3));          // f3 = 1 lowest; f2 now 2
  CHECK(req(4) == make_key(0, 1));          // f1 = f2 = 2: oldest (1) goes
}

TEST_CASE("hybrid: count is capped at 255, so heavy keys tie and recency decides") {
  SlotDirectory dir(2, make_hybrid_policy());
  auto none = [](Key) { return false; };
  Key a = make_key(0, 1), b = make_key(0, 2), c = make_key(0, 3);
  for (int i = 0; i < 300; ++i) {
    dir.policy().on_request(a);
    if (dir.find(a)) dir.policy().on_hit(a); else REQUIRE(dir.place(a, Phase::kDecode, none));
  }
  for (int i = 0; i < 255; ++i) {
    dir.policy().on_request(b);
    if (dir.find(b)) dir.policy().on_hit(b); else REQUIRE(dir.place(b, Phase::kDecode, none));
  }
  dir.policy().on_request(c);
  auto p = dir.place(c, Phase::kDecode, none);
  REQUIRE(p);
  // Uncapped, a (300) would outrank b (255); capped they tie and a is older.
  CHECK(p->evicted == a);
}

TEST_CASE("hybrid: prefill scans newest first, decode oldest first") {
  // Three single-expert groups, then one group of two tokens (2 lines > top_k 1),
  // then expert 1 again.
  std::vector<TraceRecord> t = {{0, 0, 1}, {1, 0, 2}, {2, 0, 3}, {3, 0, 4}, {3, 0, 5}, {4, 0, 1}};
  // Prefill: 4 evicts 3 (newest), 5 evicts 2 -> 1 survives and hits.
  auto pre = run(t, 3, PolicyKind::kHybrid, 1);
  CHECK(pre.hits == 1);
  // With top_k 2 the same group is a decode step: 4 evicts 1, 5 evicts 2 -> 1 misses.
  auto dec = run(t, 3, PolicyKind::kHybrid, 2);
  CHECK(dec.hits == 0);
  CHECK(dec.misses == 6);
}

TEST_CASE("protected keys are never evicted") {
  for (auto kind : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kHybrid, PolicyKind::kBelady}) {
    SlotDirectory dir(3, make_policy(kind));
    auto none = [](Key) { return false; };
    for (uint32_t e = 0; e < 3; ++e) REQUIRE(dir.place(make_key(0, e), Phase::kDecode, none));
    // Protect everything: no victim.
    auto all = [](Key) { return true; };
    CHECK_FALSE(dir.place(make_key(0, 9), Phase::kDecode, all).has_value());
    CHECK(dir.resident_count() == 3);
    // Protect all but expert 1: it must be the victim, whatever the policy prefers.
    auto all_but_1 = [](Key k) { return key_expert(k) != 1; };
    auto p = dir.place(make_key(0, 9), Phase::kPrefill, all_but_1);
    REQUIRE(p);
    CHECK(p->evicted == make_key(0, 1));
    CHECK(p->slot == 1);
  }
}

TEST_CASE("replay: a group wider than the cache bypasses instead of evicting its own keys") {
  // Group of 3 distinct experts in a cache of 2 slots.
  std::vector<TraceRecord> t = {{0, 0, 1}, {0, 0, 2}, {0, 0, 3}, {1, 0, 1}, {1, 0, 2}, {1, 0, 3}};
  auto r = run(t, 2, PolicyKind::kLru, 3);
  CHECK(r.misses == 4);  // group 0: 3 misses, 1 bypassed; group 1: 3 is missing
  CHECK(r.hits == 2);
  CHECK(r.bypassed == 2);
  CHECK(r.evictions == 0);
}

TEST_CASE("replay: one cache shared by layers, counted per layer, distinct keys per group") {
  // step 0: layer 0 {1,2}, layer 1 {1,1(dup),3}; step 1: layer 0 {1,2}, layer 1 {1,3}
  std::vector<TraceRecord> t = {{0, 0, 1}, {0, 0, 2}, {0, 1, 1}, {0, 1, 1}, {0, 1, 3},
                                {1, 0, 1}, {1, 0, 2}, {1, 1, 1}, {1, 1, 3}};
  auto r = run(t, 4, PolicyKind::kLru, 2);
  REQUIRE(r.per_layer.size() == 2);
  CHECK(r.per_layer[0].misses == 2);
  CHECK(r.per_layer[0].hits == 2);
  CHECK(r.per_layer[1].misses == 2);  // duplicate expert counted once
  CHECK(r.per_layer[1].hits == 2);
  // (0,1) and (1,1) are different keys: capacity 3 makes them compete.
  auto small = run(t, 3, PolicyKind::kLru, 2);
  CHECK(small.hits + small.misses == 8);
  CHECK(small.hits < 4);
}

TEST_CASE("replay: belady never does worse than the online policies") {
  std::vector<TraceRecord> t;
  uint64_t x = 12345;
  for (uint64_t s = 0; s < 400; ++s)
    for (uint32_t l = 0; l < 3; ++l)
      for (int j = 0; j < 2; ++j) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t e = uint32_t((x >> 33) % 16);
        e = e * e / 16;  // skewed towards small ids
        t.push_back({s, l, e});
      }
  for (uint64_t cap : {2, 5, 9, 20}) {
    auto min = run(t, cap, PolicyKind::kBelady);
    for (auto p : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kHybrid})
      CHECK(run(t, cap, p).hits <= min.hits);
  }
}

TEST_CASE("replay: bad capacity is rejected") {
  ReplayOptions o;
  o.capacity = 0;
  CHECK(replay_trace({}, o).error().code == XPACK_E_INVALID_ARG);
}

namespace {

// Replays a one-layer decode trace (one key per step) against a directory of `cap`
// slots and the given policy object; returns the hits.
uint64_t hits_of(const std::vector<uint32_t>& experts, uint64_t cap, std::unique_ptr<EvictionPolicy> p) {
  SlotDirectory dir(cap, std::move(p));
  uint64_t hits = 0;
  auto none = [](Key) { return false; };
  for (uint32_t e : experts) {
    const Key k = make_key(0, e);
    dir.policy().on_request(k);
    if (dir.find(k)) {
      dir.policy().on_hit(k);
      ++hits;
    } else {
      REQUIRE(dir.place(k, Phase::kDecode, none).has_value());
    }
  }
  return hits;
}

// Hot keys 0..4 each come back every 10 requests, between them a stream of keys
// never seen again: capacity 6 cannot keep a hot key under LRU (9 others between
// its uses), while a count-keeping policy keeps all five and cycles the one-off
// keys through the sixth slot.
std::vector<uint32_t> steady_hot_set(int rounds) {
  std::vector<uint32_t> t;
  uint32_t cold = 100;
  for (int r = 0; r < rounds; ++r)
    for (uint32_t h = 0; h < 5; ++h) {
      t.push_back(h);
      t.push_back(cold++);
    }
  return t;
}

// Ten keys requested 300 times each, then ten others as often: the hybrid's counts
// (capped at 255, never fading) keep the first set after it is gone, so the second
// thrashes in one slot until its counts reach the cap; LRU holds the second set
// after its first round.
std::vector<uint32_t> drifting_hot_set(int rounds) {
  std::vector<uint32_t> t;
  for (uint32_t base : {0u, 10u})
    for (int r = 0; r < rounds; ++r)
      for (uint32_t e = 0; e < 10; ++e) t.push_back(base + e);
  return t;
}

}  // namespace

TEST_CASE("decay: a key requested often outlives a newer one seen once; a short half-life is LRU") {
  // 1 1 1 2 3 1 with two slots: 3 must evict 1 (LRU: least recent) or 2 (seen once).
  const std::vector<uint32_t> t = {1, 1, 1, 2, 3, 1};
  CHECK(hits_of(t, 2, make_lru_policy()) == 2);
  CHECK(hits_of(t, 2, make_decay_policy(1024)) == 3);  // 1 kept: its last request is a hit
  CHECK(hits_of(t, 2, make_decay_policy(1)) == 2);     // counts fade within a request: LRU
}

TEST_CASE("decay forgets a hot set that has gone, the hybrid does not") {
  const auto t = drifting_hot_set(300);
  const uint64_t lru = hits_of(t, 10, make_lru_policy());
  const uint64_t hybrid = hits_of(t, 10, make_hybrid_policy());
  const uint64_t decay = hits_of(t, 10, make_decay_policy(64));
  CHECK(lru == 2 * 299 * 10);        // each set misses its first round only
  CHECK(hybrid < lru * 6 / 10);       // the second set thrashes for 255 rounds
  CHECK(decay >= lru - 200);          // the first set's scores fade within a few rounds
}

TEST_CASE("adaptive follows the best candidate on both kinds of workload") {
  SUBCASE("a steady hot set among one-off keys: counts win, LRU gets nothing") {
    const auto t = steady_hot_set(400);
    const uint64_t lru = hits_of(t, 6, make_lru_policy());
    const uint64_t hybrid = hits_of(t, 6, make_hybrid_policy());
    const uint64_t adaptive = hits_of(t, 6, make_adaptive_policy());
    CHECK(lru == 0);
    CHECK(hybrid >= 5 * 398);  // every hot request after the first two rounds
    CHECK(adaptive >= hybrid * 9 / 10);
  }
  SUBCASE("a hot set that drifts: LRU wins, the hybrid thrashes") {
    const auto t = drifting_hot_set(300);
    const uint64_t lru = hits_of(t, 10, make_lru_policy());
    const uint64_t hybrid = hits_of(t, 10, make_hybrid_policy());
    const uint64_t adaptive = hits_of(t, 10, make_adaptive_policy());
    CHECK(adaptive >= lru * 9 / 10);
    CHECK(adaptive > hybrid + 1500);
  }
}

TEST_CASE("adaptive and decay: protected keys are never evicted") {
  for (auto kind : {PolicyKind::kAdaptive, PolicyKind::kDecay}) {
    SlotDirectory dir(3, make_policy(kind));
    auto none = [](Key) { return false; };
    for (uint32_t e = 0; e < 3; ++e) REQUIRE(dir.place(make_key(0, e), Phase::kDecode, none));
    auto all = [](Key) { return true; };
    CHECK_FALSE(dir.place(make_key(0, 9), Phase::kDecode, all).has_value());
    auto all_but_1 = [](Key k) { return key_expert(k) != 1; };
    auto p = dir.place(make_key(0, 9), Phase::kDecode, all_but_1);
    REQUIRE(p.has_value());
    CHECK(p->evicted == make_key(0, 1));
    CHECK(dir.find(make_key(0, 9)).has_value());
  }
}

TEST_CASE("a prefill evicts the keys only prefills used before decode's working set") {
  for (bool protect : {true, false}) {
    CAPTURE(protect);
    SlotDirectory dir(4, make_policy(PolicyKind::kLru), protect);
    std::vector<Key> pinned;
    auto is_pinned = [&](Key k) { return std::find(pinned.begin(), pinned.end(), k) != pinned.end(); };
    auto req = [&](uint32_t e, Phase phase) {
      Key k = make_key(0, e);
      dir.policy().on_request(k);
      std::optional<Key> evicted;
      if (dir.find(k)) {
        dir.policy().on_hit(k);
      } else {
        auto p = dir.place(k, phase, is_pinned);
        REQUIRE(p.has_value());
        evicted = p->evicted;
      }
      dir.note_use(k, phase);
      return evicted;
    };
    req(1, Phase::kDecode);
    req(2, Phase::kDecode);
    req(3, Phase::kPrefill);
    req(4, Phase::kPrefill);
    CHECK(dir.decode_used(make_key(0, 1)));
    CHECK_FALSE(dir.decode_used(make_key(0, 3)));
    // LRU's victim is 1 (decode's); with the protection the prefill takes 3.
    CHECK(req(5, Phase::kPrefill) == make_key(0, protect ? 3 : 1));
    // Decode evicts by the policy alone, its own keys included.
    dir.note_use(make_key(0, 4), Phase::kDecode);  // a decode hit on 4 makes it decode's too
    CHECK(dir.decode_used(make_key(0, 4)));
    if (protect) {
      // Only 5 is prefill-only now: pinned, so the prefill falls back to the policy's victim.
      pinned = {make_key(0, 5)};
      CHECK(req(6, Phase::kPrefill) == make_key(0, 1));
      CHECK_FALSE(dir.decode_used(make_key(0, 1)));  // it left
      pinned.clear();
      CHECK(req(7, Phase::kDecode) == make_key(0, 2));  // LRU among all: 2
    }
  }
}

TEST_CASE("replay: a prompt between two decode runs keeps decode's experts only with the protection") {
  // Layer 0, top-2: decode steps use 1 and 2; a 4-token prompt asks for 3..6 in
  // one group (a prefill: wider than top-k); decode comes back to 1 and 2.
  std::vector<TraceRecord> t;
  uint64_t step = 0;
  for (int i = 0; i < 3; ++i, ++step) t.insert(t.end(), {{step, 0, 1}, {step, 0, 2}});
  t.insert(t.end(), {{step, 0, 3}, {step, 0, 4}, {step, 0, 5}, {step, 0, 6}});
  ++step;
  t.insert(t.end(), {{step, 1, 3}, {step, 1, 4}, {step, 1, 5}, {step, 1, 6}});
  ++step;
  for (int i = 0; i < 2; ++i, ++step) t.insert(t.end(), {{step, 0, 1}, {step, 0, 2}});
  ReplayOptions o;
  o.capacity = 6;
  o.policy = PolicyKind::kLru;
  o.top_k = 2;
  auto on = replay_trace(t, o);
  o.protect_decode = false;
  auto off = replay_trace(t, o);
  REQUIRE(on.ok());
  REQUIRE(off.ok());
  // Layer 1's prompt group needs 4 slots with 2 free: with the protection it
  // takes two of layer 0's prompt keys, without it LRU takes 1 and 2.
  CHECK(on->hits == 4 + 4);
  CHECK(off->hits == 4 + 2);
  CHECK(on->misses == 2 + 8);
  CHECK(off->misses == 2 + 8 + 2);
}
