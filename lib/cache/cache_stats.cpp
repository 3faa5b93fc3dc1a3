// The stats JSON: the counters plus what the cache is (capacity, policy, I/O
// settings), written atomically.
#include "cache/expert_cache.h"

#include "stats/stats_json.h"

namespace xpack::cache {

Status ExpertCache::write_stats() {
  Status trace_status;
  if (trace_) {
    trace_status = trace_->flush();
    if (!trace_status.ok())
      telemetry_.update([](stats::Counters& c) { ++c.trace_write_errors; });
  }
  if (opts_.stats_path.empty()) return trace_status;
  auto c = telemetry_.snapshot();
  auto j = stats::counters_to_json(c);
  {
    std::lock_guard lk(mu_);
    j["resident_experts"] = dir_->resident_count();
    j["resident_bytes"] = uint64_t(dir_->resident_count()) * src_.object_bytes;
  }
  j["pack_path"] = src_.path;
  j["cache_policy"] = policy_name(opts_.policy);
  j["cache_capacity_experts"] = n_slots_;
  j["cache_capacity_bytes"] = uint64_t(n_slots_) * slot_stride_;
  j["host_capacity_experts"] = host_ ? host_->capacity() : 0;
  j["host_frames"] = host_frame_count();
  j["host_capacity_bytes"] = uint64_t(host_frame_count()) * frame_stride_;
  {
    std::lock_guard lk(mu_);
    j["host_resident_experts"] = host_ ? host_->held_count() : 0;
  }
  j["object_bytes"] = src_.object_bytes;
  j["staging_slots"] = opts_.staging_slots;
  j["staged_bytes"] = uint64_t(opts_.staging_slots) * src_.read_bytes;
  j["read_splits"] = opts_.read_splits;
  j["direct_io"] = opts_.direct_io;
  j["verify"] = opts_.verify;
  j["device_backend"] = dev_.backend_name();
  std::lock_guard lk(stats_write_mu_);
  XPACK_TRY(stats::write_file_atomic(opts_.stats_path, j.dump(2) + "\n"));
  return trace_status;
}

}  // namespace xpack::cache
