// Eviction policies of the expert cache. The cache (or the simulator) owns the
// slots and residency; a policy only observes requests, hits, inserts and
// removals, and names the resident key to evict. Not thread-safe: the owner
// calls it under its own lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "common/result.h"

namespace xpack::cache {

// (layer, expert) packed into one integer; layer in the high half so keys sort
// by layer first.
using Key = uint64_t;
constexpr Key make_key(uint32_t layer, uint32_t expert) {
  return (uint64_t{layer} << 32) | expert;
}
constexpr uint32_t key_layer(Key k) { return uint32_t(k >> 32); }
constexpr uint32_t key_expert(Key k) { return uint32_t(k); }

enum class PolicyKind { kLru, kLfu, kHybrid, kBelady, kDecay, kAdaptive, kOracleLfu };

// Policies that need the whole trace in advance: the simulator's references, which
// the cache refuses.
constexpr bool is_offline(PolicyKind k) { return k == PolicyKind::kBelady || k == PolicyKind::kOracleLfu; }

// "lru", "lfu", "hybrid", "belady", "decay", "adaptive", "oracle-lfu".
Result<PolicyKind> parse_policy(std::string_view name);
const char* policy_name(PolicyKind kind);

// Prefill requests many tokens at once; the seed's hybrid scans newest-first then
// so the experts of the tokens just processed go before long-lived ones.
enum class Phase { kDecode, kPrefill };

using ProtectedFn = std::function<bool(Key)>;

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual PolicyKind kind() const = 0;
  // Key k is requested by a demand acquire (once per distinct key per request),
  // before hits and misses are classified.
  virtual void on_request(Key) {}
  // Resident key k was requested again.
  virtual void on_hit(Key k) = 0;
  // Key k became resident (demand miss or prefetch).
  virtual void on_insert(Key k) = 0;
  // Key k left the cache (evicted, or its load failed).
  virtual void on_remove(Key k) = 0;
  // The resident key to evict, never one for which is_protected(k) is true;
  // nullopt if every resident key is protected.
  virtual std::optional<Key> choose_victim(const ProtectedFn& is_protected, Phase phase) = 0;
  // Whether a prefetch of `incoming` may evict `victim` (the victim chosen by
  // choose_victim): prefetch hints must never displace a more valuable resident key.
  virtual bool prefetch_may_displace(Key incoming, Key victim) const = 0;
  // Only Belady's MIN looks at the future: position of the next request of k
  // (UINT64_MAX for never). The simulator calls it before on_hit/on_insert.
  virtual void set_next_use(Key, uint64_t) {}
  // Only the oracle LFU looks at the whole trace: the number of requests of k in it.
  // The simulator calls it once per key before the replay.
  virtual void set_trace_count(Key, uint64_t) {}
};

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind);

// Least recently requested first.
std::unique_ptr<EvictionPolicy> make_lru_policy();
// Fewest requests while resident (the count restarts when a key re-enters), ties
// least recent first.
std::unique_ptr<EvictionPolicy> make_lfu_policy();
// The seed's "reuse-lfu-lru-v2": lowest request count capped at 255 that survives
// eviction, ties by recency (oldest first in decode, newest first in prefill).
std::unique_ptr<EvictionPolicy> make_hybrid_policy();
// Decayed frequency (LRFU): the lowest sum of 2^(-age / half_life) over a key's
// requests (age in requests; the history survives eviction).
std::unique_ptr<EvictionPolicy> make_decay_policy(double half_life = 1024);
// Evicts as the one of LRU, decay (two half-lives) and hybrid whose own simulated
// cache of this size hit most on the recent requests (policy_adaptive.cpp).
std::unique_ptr<EvictionPolicy> make_adaptive_policy();
// Belady's MIN: the resident key whose next request is farthest in the future.
std::unique_ptr<EvictionPolicy> make_belady_policy();
// LFU by each key's request count over the whole trace (fewest first, ties least
// recent first): the keys the trace requests most stay, as a policy that knew every
// expert's popularity would keep them (policy_oracle_lfu.cpp).
std::unique_ptr<EvictionPolicy> make_oracle_lfu_policy();

}  // namespace xpack::cache
