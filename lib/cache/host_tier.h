// The host tier's bookkeeping: which key each frame of pinned host memory holds.
// A *frame* holds one whole object. The tier is exclusive of the device slots
// (a victim cache): a key enters it when the device evicts it (demotion: one
// device->host copy, no SSD read) and leaves it when a device miss finds it
// there (promotion: one host->device copy), so device + host hold as many
// distinct experts as their sizes add up to. Within the tier the oldest demotion
// goes first (LRU): the device policy already decided what is valuable, and the
// tier only extends its reach.
//
// One frame is always kept free: a promotion and the demotion it causes swap
// two experts between a slot and the tier, and the victim cannot go into the
// promoted key's frame (that frame is copied out of into the very slot the
// victim leaves), so without the spare every swap would drop another key.
// Shared by the runtime cache and xpack-sim's two-level replay so both apply
// the same rules. Not thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cache/policy.h"

namespace xpack::cache {

class HostTier {
 public:
  explicit HostTier(uint32_t n_frames);

  uint32_t frame_count() const { return n_frames_; }
  // Keys it holds at most: every frame but the spare.
  uint32_t capacity() const { return n_frames_ ? n_frames_ - 1 : 0; }
  size_t held_count() const { return where_.size(); }
  bool holds(Key k) const { return where_.count(k) != 0; }

  // A device miss found k here: k leaves the tier and its frame is returned,
  // still *taken*: it is not reused until give_back(frame), so the caller can
  // enqueue the copy out of it first.
  std::optional<uint32_t> take(Key k);
  void give_back(uint32_t frame);

  struct Admission {
    uint32_t frame;
    std::optional<Key> evicted;  // the oldest key, dropped to make room
  };
  // Gives k (not held) a free frame, first dropping the oldest key when the
  // tier holds its capacity. nullopt for a tier of capacity 0.
  std::optional<Admission> admit(Key k);
  // Takes k out with its frame freed (its demotion copy failed).
  void drop(Key k);

 private:
  struct Held {
    uint32_t frame;
    std::list<Key>::iterator age;
  };
  uint32_t n_frames_;
  std::list<Key> oldest_first_;
  std::unordered_map<Key, Held> where_;
  std::vector<uint32_t> free_;
};

}  // namespace xpack::cache
