// Moving experts between the device slots and the host tier (host_tier.h).
// Everything here runs under mu_ and only enqueues copies: the device's single
// copy stream orders them against the reads' copies (device.h).
#include "cache/expert_cache.h"

namespace xpack::cache {

void ExpertCache::demote(uint32_t slot) {
  Slot& s = slots_[slot];
  // Only published bytes are worth keeping: a load still queued or in flight
  // has nothing in the slot yet, and a failed one has nothing valid.
  if (!host_ || s.state != SlotState::kCopying) return;
  auto admitted = host_->admit(s.key);
  if (!admitted) return;  // a tier of one frame holds nothing (it is the spare)
  Status st = dev_.copy_to_host_async(frame_data(admitted->frame), slot_data(slot), src_.object_bytes, nullptr);
  if (!st.ok()) {
    // The expert is only lost to the tier: the pack still has it.
    host_->drop(s.key);
    telemetry_.update([&](stats::Counters& c) { ++c.io_errors; });
    return;
  }
  telemetry_.update([&](stats::Counters& c) {
    ++c.host_demotions;
    c.d2h_bytes += src_.object_bytes;
    c.host_evictions += admitted->evicted.has_value();
  });
}

void ExpertCache::fill_slot(uint32_t slot, Key k, bool evicted, bool prefetch) {
  // k's frame is taken before the victim is demoted, so the demotion cannot
  // push k itself out of a full tier; the victim's copy out is enqueued before
  // the copy that overwrites its slot.
  std::optional<uint32_t> frame = host_ ? host_->take(k) : std::nullopt;
  if (evicted) demote(slot);
  if (!frame) {
    start_load(slot, k, prefetch);
    return;
  }
  Slot& s = slots_[slot];
  s.key = k;
  s.queued = false;
  s.prefetched_unused = prefetch;
  s.certain = false;
  Status st = dev_.copy_to_device_async(slot_data(slot), frame_data(*frame), src_.object_bytes, s.ready.get());
  // The frame may take the next demotion: that copy is enqueued after this one.
  host_->give_back(*frame);
  if (!st.ok()) {
    s.state = SlotState::kFailed;
    s.error = st.error().code < 0 ? st.error().code : XPACK_E_DEVICE;
    s.prefetched_unused = false;
    telemetry_.update([&](stats::Counters& c) { ++c.io_errors; });
    return;
  }
  s.state = SlotState::kCopying;
  s.error = 0;
  telemetry_.update([&](stats::Counters& c) {
    ++c.host_hits;
    c.h2d_bytes += src_.object_bytes;
  });
}

}  // namespace xpack::cache
