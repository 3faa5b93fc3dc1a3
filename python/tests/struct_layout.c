/* Prints sizeof and offsetof of every struct the Python binding mirrors, as
 * JSON, from the real header: test_layout.py compares them with ctypes. A
 * field added to a struct changes its sizeof, so a mirror left behind fails. */
#include <stddef.h>
#include <stdio.h>

#include "xpack/xpack.h"

#define BEGIN(T) printf("%s\"%s\": {\"sizeof\": %zu", first ? "" : ", ", #T, sizeof(T)), first = 0
#define FIELD(T, f) printf(", \"%s\": %zu", #f, offsetof(T, f))
#define END() printf("}")

int main(void) {
  int first = 1;
  printf("{");
  BEGIN(xpack_pack_options); FIELD(xpack_pack_options, size); FIELD(xpack_pack_options, trunk_path); END();
  BEGIN(xpack_pack_fault); FIELD(xpack_pack_fault, size); FIELD(xpack_pack_fault, layer);
  FIELD(xpack_pack_fault, expert); FIELD(xpack_pack_fault, role); END();
  BEGIN(xpack_pack_info); FIELD(xpack_pack_info, size); FIELD(xpack_pack_info, version);
  FIELD(xpack_pack_info, arch); FIELD(xpack_pack_info, n_layers); FIELD(xpack_pack_info, n_experts);
  FIELD(xpack_pack_info, n_experts_used); FIELD(xpack_pack_info, n_roles); FIELD(xpack_pack_info, alignment);
  FIELD(xpack_pack_info, data_start); FIELD(xpack_pack_info, object_stride); FIELD(xpack_pack_info, object_bytes);
  FIELD(xpack_pack_info, file_size); FIELD(xpack_pack_info, source_sha256); END();
  BEGIN(xpack_role_info); FIELD(xpack_role_info, size); FIELD(xpack_role_info, name); FIELD(xpack_role_info, type);
  FIELD(xpack_role_info, n_dims); FIELD(xpack_role_info, ne); FIELD(xpack_role_info, offset);
  FIELD(xpack_role_info, nbytes); END();
  BEGIN(xpack_cache_options); FIELD(xpack_cache_options, size); FIELD(xpack_cache_options, budget_bytes); FIELD(xpack_cache_options, reserve_bytes); FIELD(xpack_cache_options, policy); FIELD(xpack_cache_options, device); FIELD(xpack_cache_options, cuda_device); FIELD(xpack_cache_options, staging_slots); FIELD(xpack_cache_options, read_splits); FIELD(xpack_cache_options, queue_depth); FIELD(xpack_cache_options, direct_io); FIELD(xpack_cache_options, verify); FIELD(xpack_cache_options, stats_path); FIELD(xpack_cache_options, stats_interval); FIELD(xpack_cache_options, trace_path); FIELD(xpack_cache_options, host_device_bytes); FIELD(xpack_cache_options, host_cache_bytes); END();
  BEGIN(xpack_cache_info); FIELD(xpack_cache_info, size); FIELD(xpack_cache_info, slot_count); FIELD(xpack_cache_info, n_layers); FIELD(xpack_cache_info, n_experts); FIELD(xpack_cache_info, slot_stride); FIELD(xpack_cache_info, object_bytes); FIELD(xpack_cache_info, device_backend); FIELD(xpack_cache_info, policy); FIELD(xpack_cache_info, host_frames); FIELD(xpack_cache_info, host_frame_stride); END();
  BEGIN(xpack_expert_slot); FIELD(xpack_expert_slot, expert); FIELD(xpack_expert_slot, slot); FIELD(xpack_expert_slot, data); FIELD(xpack_expert_slot, ready_event); FIELD(xpack_expert_slot, hit); FIELD(xpack_expert_slot, ready_recorded); END();
  BEGIN(xpack_cache_counters); FIELD(xpack_cache_counters, size); FIELD(xpack_cache_counters, cache_hits); FIELD(xpack_cache_counters, cache_misses); FIELD(xpack_cache_counters, cache_evictions); FIELD(xpack_cache_counters, pack_reads); FIELD(xpack_cache_counters, pack_read_bytes); FIELD(xpack_cache_counters, h2d_bytes); FIELD(xpack_cache_counters, fallback_count); FIELD(xpack_cache_counters, io_errors); FIELD(xpack_cache_counters, prefetch_issued); FIELD(xpack_cache_counters, prefetch_used); FIELD(xpack_cache_counters, prefetch_wasted); FIELD(xpack_cache_counters, acquires); FIELD(xpack_cache_counters, steps); FIELD(xpack_cache_counters, stall_ns); FIELD(xpack_cache_counters, stall_waits); FIELD(xpack_cache_counters, read_p50_ns); FIELD(xpack_cache_counters, read_p99_ns); FIELD(xpack_cache_counters, h2d_p50_ns); FIELD(xpack_cache_counters, h2d_p99_ns); FIELD(xpack_cache_counters, n_layers); FIELD(xpack_cache_counters, trace_write_errors); FIELD(xpack_cache_counters, staging_page_bytes); FIELD(xpack_cache_counters, staging_huge_fraction); FIELD(xpack_cache_counters, host_hits); FIELD(xpack_cache_counters, host_demotions); FIELD(xpack_cache_counters, host_evictions); FIELD(xpack_cache_counters, d2h_bytes); FIELD(xpack_cache_counters, ssd_busy_ns); END();
  BEGIN(xpack_layer_counters); FIELD(xpack_layer_counters, size); FIELD(xpack_layer_counters, route_calls); FIELD(xpack_layer_counters, route_tokens); FIELD(xpack_layer_counters, hits); FIELD(xpack_layer_counters, misses); END();
  BEGIN(xpack_engine_options); FIELD(xpack_engine_options, size); FIELD(xpack_engine_options, slots); FIELD(xpack_engine_options, queue_depth); FIELD(xpack_engine_options, read_splits); FIELD(xpack_engine_options, sqpoll); FIELD(xpack_engine_options, direct_io); FIELD(xpack_engine_options, numa_node); FIELD(xpack_engine_options, numa_bind); END();
  BEGIN(xpack_read_request); FIELD(xpack_read_request, layer_slot); FIELD(xpack_read_request, expert); FIELD(xpack_read_request, slot); END();
  BEGIN(xpack_read_completion); FIELD(xpack_read_completion, slot); FIELD(xpack_read_completion, layer_slot); FIELD(xpack_read_completion, expert); FIELD(xpack_read_completion, status); END();
  BEGIN(xpack_engine_counters); FIELD(xpack_engine_counters, size); FIELD(xpack_engine_counters, reads); FIELD(xpack_engine_counters, read_bytes); FIELD(xpack_engine_counters, objects_completed); FIELD(xpack_engine_counters, io_errors); FIELD(xpack_engine_counters, fallback_count); FIELD(xpack_engine_counters, short_read_retries); FIELD(xpack_engine_counters, transient_retries); FIELD(xpack_engine_counters, lat_p50_ns); FIELD(xpack_engine_counters, lat_p99_ns); FIELD(xpack_engine_counters, lat_p999_ns); FIELD(xpack_engine_counters, lat_log2_ns); FIELD(xpack_engine_counters, ring_flags); FIELD(xpack_engine_counters, staging_page_bytes); FIELD(xpack_engine_counters, staging_huge_fraction); END();
  printf("}\n");
  return 0;
}
