#include "cache/replay.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "cache/host_tier.h"
#include "cache/slot_directory.h"

namespace xpack::cache {
namespace {

struct Group {
  size_t begin, end;       // record range
  std::vector<Key> keys;   // distinct keys, sorted (the seed classifies in key order)
};

std::vector<Group> split_groups(const std::vector<stats::TraceRecord>& t) {
  std::vector<Group> groups;
  size_t i = 0;
  while (i < t.size()) {
    size_t j = i;
    while (j < t.size() && t[j].step == t[i].step && t[j].layer == t[i].layer) ++j;
    Group g{i, j, {}};
    for (size_t r = i; r < j; ++r) g.keys.push_back(make_key(t[r].layer, t[r].expert));
    std::sort(g.keys.begin(), g.keys.end());
    g.keys.erase(std::unique(g.keys.begin(), g.keys.end()), g.keys.end());
    groups.push_back(std::move(g));
    i = j;
  }
  return groups;
}

}  // namespace

Result<ReplayResult> replay_trace(const std::vector<stats::TraceRecord>& trace,
                                  const ReplayOptions& opts) {
  if (opts.capacity == 0 || opts.capacity > UINT32_MAX)
    return err(XPACK_E_INVALID_ARG, "capacity must be between 1 and {} slots", UINT32_MAX);
  auto groups = split_groups(trace);

  uint64_t top_k = opts.top_k;
  if (top_k == 0) {
    top_k = UINT64_MAX;
    for (auto& g : groups) top_k = std::min<uint64_t>(top_k, g.end - g.begin);
    if (groups.empty()) top_k = 1;
  }

  // next_use[g][i]: index of the next group requesting groups[g].keys[i].
  std::vector<std::vector<uint64_t>> next_use(groups.size());
  if (opts.policy == PolicyKind::kBelady) {
    std::unordered_map<Key, uint64_t> seen_next;
    for (size_t g = groups.size(); g-- > 0;) {
      next_use[g].resize(groups[g].keys.size());
      for (size_t i = 0; i < groups[g].keys.size(); ++i) {
        Key k = groups[g].keys[i];
        auto it = seen_next.find(k);
        next_use[g][i] = it == seen_next.end() ? UINT64_MAX : it->second;
        seen_next[k] = g;
      }
    }
  }

  if (opts.host_capacity > UINT32_MAX)
    return err(XPACK_E_INVALID_ARG, "host capacity must be at most {} frames", UINT32_MAX);
  SlotDirectory dir(uint32_t(opts.capacity), make_policy(opts.policy), opts.protect_decode);
  HostTier host(uint32_t(opts.host_capacity));
  EvictionPolicy& policy = dir.policy();
  if (opts.policy == PolicyKind::kOracleLfu) {
    // Requests as the replay counts them: once per distinct key per group.
    std::unordered_map<Key, uint64_t> count;
    for (const Group& grp : groups)
      for (Key k : grp.keys) ++count[k];
    for (const auto& [k, n] : count) policy.set_trace_count(k, n);
  }
  ReplayResult res;
  std::unordered_set<Key> group_keys;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Group& grp = groups[g];
    Phase phase = uint64_t(grp.end - grp.begin) > top_k ? Phase::kPrefill : Phase::kDecode;
    group_keys.clear();
    group_keys.insert(grp.keys.begin(), grp.keys.end());
    auto is_protected = [&](Key k) { return group_keys.count(k) != 0; };
    for (Key k : grp.keys) policy.on_request(k);
    for (size_t i = 0; i < grp.keys.size(); ++i) {
      Key k = grp.keys[i];
      uint32_t layer = key_layer(k);
      if (res.per_layer.size() <= layer) res.per_layer.resize(size_t(layer) + 1);
      if (opts.policy == PolicyKind::kBelady) policy.set_next_use(k, next_use[g][i]);
      if (dir.find(k)) {
        ++res.hits;
        ++res.per_layer[layer].hits;
        policy.on_hit(k);
        dir.note_use(k, phase);
        continue;
      }
      ++res.misses;
      ++res.per_layer[layer].misses;
      auto placed = dir.place(k, phase, is_protected);
      if (!placed) {
        ++res.bypassed;
        continue;
      }
      dir.note_use(k, phase);
      // As ExpertCache::fill_slot: k's frame first, then the victim's demotion.
      std::optional<uint32_t> frame = host.take(k);
      if (placed->evicted) {
        ++res.evictions;
        if (opts.host_capacity) {
          if (auto a = host.admit(*placed->evicted)) {
            ++res.host_demotions;
            res.host_evictions += a->evicted.has_value();
          }
        }
      }
      if (frame) {
        ++res.host_hits;
        host.give_back(*frame);
      }
    }
  }
  return res;
}

}  // namespace xpack::cache
