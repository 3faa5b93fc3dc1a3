// The resident keys of a policy ordered by (rank, stamp): every policy here is
// "evict the lowest rank, break ties by recency", so they share this structure.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "cache/policy.h"

namespace xpack::cache {

class RankedKeys {
 public:
  void upsert(Key k, uint64_t rank, uint64_t stamp) {
    erase(k);
    pos_[k] = Pos{rank, stamp};
    order_.emplace(rank, stamp, k);
  }
  void erase(Key k) {
    auto it = pos_.find(k);
    if (it == pos_.end()) return;
    order_.erase({it->second.rank, it->second.stamp, k});
    pos_.erase(it);
  }
  bool contains(Key k) const { return pos_.count(k) != 0; }
  uint64_t rank(Key k) const {
    auto it = pos_.find(k);
    return it == pos_.end() ? 0 : it->second.rank;
  }
  uint64_t stamp(Key k) const {
    auto it = pos_.find(k);
    return it == pos_.end() ? 0 : it->second.stamp;
  }

  // The unprotected key of lowest rank; within that rank the smallest stamp
  // (newest_first = false) or the largest (newest_first = true).
  std::optional<Key> lowest(const ProtectedFn& is_protected, bool newest_first) const {
    auto it = order_.begin();
    while (it != order_.end()) {
      uint64_t r = std::get<0>(*it);
      auto bucket_end = r == UINT64_MAX ? order_.end() : order_.lower_bound({r + 1, 0, 0});
      if (!newest_first) {
        for (auto j = it; j != bucket_end; ++j)
          if (!is_protected(std::get<2>(*j))) return std::get<2>(*j);
      } else {
        for (auto j = bucket_end; j != it;) {
          --j;
          if (!is_protected(std::get<2>(*j))) return std::get<2>(*j);
        }
      }
      it = bucket_end;
    }
    return std::nullopt;
  }

 private:
  struct Pos {
    uint64_t rank, stamp;
  };
  std::unordered_map<Key, Pos> pos_;
  std::set<std::tuple<uint64_t, uint64_t, Key>> order_;
};

}  // namespace xpack::cache
