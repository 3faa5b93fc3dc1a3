#include "cache/host_tier.h"

namespace xpack::cache {

HostTier::HostTier(uint32_t n_frames) : n_frames_(n_frames) {
  free_.reserve(n_frames);
  // Lowest frame first, so that a small tier's use is easy to read in tests.
  for (uint32_t f = n_frames; f-- > 0;) free_.push_back(f);
}

std::optional<uint32_t> HostTier::take(Key k) {
  auto it = where_.find(k);
  if (it == where_.end()) return std::nullopt;
  uint32_t frame = it->second.frame;
  oldest_first_.erase(it->second.age);
  where_.erase(it);
  return frame;
}

void HostTier::give_back(uint32_t frame) { free_.push_back(frame); }

std::optional<HostTier::Admission> HostTier::admit(Key k) {
  if (holds(k) || capacity() == 0) return std::nullopt;
  Admission a{};
  if (where_.size() >= capacity()) {
    Key victim = oldest_first_.front();
    a.evicted = victim;
    free_.push_back(where_.at(victim).frame);
    oldest_first_.pop_front();
    where_.erase(victim);
  }
  // Held keys < capacity leaves two free frames here, or one and a frame
  // taken by a promotion in progress: a free frame always exists.
  a.frame = free_.back();
  free_.pop_back();
  oldest_first_.push_back(k);
  where_[k] = Held{a.frame, std::prev(oldest_first_.end())};
  return a;
}

void HostTier::drop(Key k) {
  if (auto f = take(k)) give_back(*f);
}

}  // namespace xpack::cache
