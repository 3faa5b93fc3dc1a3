// C API of the I/O engine (xpack_engine_*): a thin shell over io::ReadEngine bound
// to a pack through the public pack accessors.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/io_mode.h"
#include "capi/sized_struct.h"
#include "common/handle_message.h"
#include "common/result.h"
#include "io/engine_defaults.h"
#include "io/pack_reads.h"
#include "io/read_engine.h"
#include "xpack/xpack.h"

struct xpack_engine {
  std::unique_ptr<xpack::io::ReadEngine> engine;
  xpack::io::PackGeometry geometry;
  xpack::HandleMessage errmsg;  // one message per calling thread
  std::vector<xpack::io::Completion> scratch;
};

namespace {

int fail_handle(const xpack_engine* e, const xpack::Error& err) {
  return xpack::record_failure(e ? &e->errmsg : nullptr, err.code, err.message);
}

int fail_handle(const xpack_engine* e, int code, const std::string& msg) {
  return fail_handle(e, xpack::Error{code, msg});
}

xpack::Result<xpack::io::PackGeometry> geometry_from_pack(const xpack_pack* p) {
  xpack_pack_info info{};
  info.size = sizeof(info);
  int rc = xpack_pack_get_info(p, &info);
  if (rc != 0) return xpack::err(rc, "xpack_pack_get_info failed: {}", xpack_pack_errmsg(p));
  const char* path = xpack_pack_path(p);
  if (!path) return xpack::err(XPACK_E_INVALID_ARG, "pack has no path");
  xpack::io::PackGeometry g;
  g.path = path;
  g.data_start = info.data_start;
  g.object_stride = info.object_stride;
  g.object_bytes = info.object_bytes;
  g.n_layers = info.n_layers;
  g.n_experts = info.n_experts;
  XPACK_TRY(xpack::io::check_geometry(g));
  return g;
}

}  // namespace

extern "C" {

XPACK_API int xpack_engine_options_init(xpack_engine_options* opts) {
  if (!opts) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null options");
  *opts = xpack_engine_options{};
  opts->size = sizeof(*opts);
  opts->slots = xpack::io::kDefaultStagingBuffers;
  opts->queue_depth = xpack::io::kDefaultQueueDepth;
  opts->read_splits = xpack::io::kDefaultReadSplits;
  opts->sqpoll = 0;
  opts->direct_io = XPACK_IO_DIRECT;
  opts->numa_node = -1;
  opts->numa_bind = 0;
  return 0;
}

XPACK_API int xpack_engine_create(xpack_pack* p, const xpack_engine_options* opts,
                                  xpack_engine** out) {
  if (!out) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null output pointer");
  *out = nullptr;
  if (!p) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null pack");
  if (opts && !xpack::capi::sized_struct_ok(opts))
    return fail_handle(nullptr, XPACK_E_INVALID_ARG, "options size field not set");
  xpack_engine_options o{};
  xpack_engine_options_init(&o);
  if (opts) xpack::capi::merge_sized_options(&o, *opts);
  auto geometry = geometry_from_pack(p);
  if (!geometry.ok()) return fail_handle(nullptr, geometry.error());

  auto cfg = xpack::io::engine_config_for(
      *geometry, o.slots ? o.slots : xpack::io::kDefaultStagingBuffers,
      o.queue_depth ? o.queue_depth : xpack::io::kDefaultQueueDepth,
      o.read_splits ? o.read_splits : xpack::io::kDefaultReadSplits);
  cfg.sqpoll = o.sqpoll != 0;
  auto direct = xpack::capi::direct_io_from(o.direct_io);
  if (!direct.ok()) return fail_handle(nullptr, direct.error());
  cfg.direct_io = *direct;
  if (o.numa_bind != 0 && o.numa_node < 0)
    return fail_handle(nullptr, XPACK_E_INVALID_ARG,
                       fmt::format("numa_bind set with numa_node {} (need a node >= 0)", o.numa_node));
  cfg.numa_node = o.numa_bind != 0 ? o.numa_node : -1;
  auto engine = xpack::io::ReadEngine::create(std::move(cfg));
  if (!engine.ok()) return fail_handle(nullptr, engine.error());

  auto* e = new xpack_engine();
  e->engine = std::move(engine).value();
  e->geometry = std::move(geometry).value();
  *out = e;
  return 0;
}

XPACK_API void xpack_engine_destroy(xpack_engine* e) { delete e; }

XPACK_API const char* xpack_engine_errmsg(const xpack_engine* e) {
  return e ? e->errmsg.get() : "";
}

XPACK_API int xpack_engine_submit(xpack_engine* e, const xpack_read_request* reqs, size_t n,
                                  size_t elem_size) {
  if (!e) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null engine");
  static_assert(sizeof(xpack_read_request) >= XPACK_READ_REQUEST_SIZE_V1);
  if (auto st = xpack::capi::check_element_size(elem_size, XPACK_READ_REQUEST_SIZE_V1, "xpack_engine_submit",
                                                "xpack_read_request");
      !st.ok())
    return fail_handle(e, st.error());
  if (n == 0) return 0;
  if (!reqs) return fail_handle(e, XPACK_E_INVALID_ARG, "null request array");
  std::vector<xpack::io::ReadRequest> batch;
  batch.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto q = xpack::capi::element_in<xpack_read_request>(reqs, i, elem_size);
    auto r = xpack::io::object_read(e->geometry, q.layer_slot, q.expert, q.slot);
    if (!r.ok()) return fail_handle(e, r.error());
    batch.push_back(*r);
  }
  auto st = e->engine->submit(batch);
  if (!st.ok()) return fail_handle(e, st.error());
  return 0;
}

XPACK_API int xpack_engine_reap(xpack_engine* e, xpack_read_completion* out, size_t max,
                                size_t elem_size, int timeout_ms) {
  if (!e) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null engine");
  static_assert(sizeof(xpack_read_completion) >= XPACK_READ_COMPLETION_SIZE_V1);
  if (auto st = xpack::capi::check_element_size(elem_size, XPACK_READ_COMPLETION_SIZE_V1, "xpack_engine_reap",
                                                "xpack_read_completion");
      !st.ok())
    return fail_handle(e, st.error());
  if (max == 0) return 0;
  if (!out) return fail_handle(e, XPACK_E_INVALID_ARG, "null completion array");
  if (max > INT32_MAX) max = INT32_MAX;
  e->scratch.clear();
  auto r = e->engine->poll(timeout_ms, &e->scratch, max);
  if (!r.ok()) return fail_handle(e, r.error());
  for (size_t i = 0; i < e->scratch.size(); ++i) {
    const auto& c = e->scratch[i];
    xpack_read_completion v{};
    v.slot = c.slot;
    v.layer_slot = xpack::io::tag_layer_slot(c.tag);
    v.expert = xpack::io::tag_expert(c.tag);
    v.status = c.status;
    xpack::capi::element_out(out, i, elem_size, v);
    if (c.status != 0) e->errmsg.set(e->engine->last_failure());
  }
  return static_cast<int>(e->scratch.size());
}

XPACK_API int xpack_engine_slot_data(const xpack_engine* e, uint32_t slot, const void** data,
                                     size_t* bytes) {
  if (!e || !data) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null engine or output");
  *data = nullptr;
  if (slot >= e->engine->slot_count())
    return fail_handle(nullptr, XPACK_E_INVALID_ARG,
                       fmt::format("slot {} out of range ({} slots)", slot, e->engine->slot_count()));
  if (e->engine->slot_state(slot) != xpack::io::SlotState::kReady)
    return fail_handle(nullptr, XPACK_E_INVALID_ARG,
                       fmt::format("slot {} holds no completed object", slot));
  *data = e->engine->slot_data(slot);
  if (bytes) *bytes = e->geometry.object_bytes;
  return 0;
}

XPACK_API int xpack_engine_get_counters(const xpack_engine* e, xpack_engine_counters* out) {
  if (!e || !out) return fail_handle(nullptr, XPACK_E_INVALID_ARG, "null engine or output");
  if (!xpack::capi::sized_struct_ok(out))
    return fail_handle(nullptr, XPACK_E_INVALID_ARG, "counters size field not set");
  const auto& c = e->engine->counters();
  xpack_engine_counters v{};
  v.size = sizeof(v);
  v.reads = c.reads;
  v.read_bytes = c.read_bytes;
  v.objects_completed = c.objects_completed;
  v.io_errors = c.io_errors;
  v.fallback_count = c.fallback_count;
  v.short_read_retries = c.short_read_retries;
  v.transient_retries = c.transient_retries;
  v.lat_p50_ns = c.latency.quantile_ns(0.5);
  v.lat_p99_ns = c.latency.quantile_ns(0.99);
  v.lat_p999_ns = c.latency.quantile_ns(0.999);
  auto log2 = c.latency.log2_counts();
  for (int i = 0; i < 64; ++i) v.lat_log2_ns[i] = log2[i];
  v.ring_flags = e->engine->ring_flags();
  v.staging_page_bytes = e->engine->arena().page_bytes();
  v.staging_huge_fraction = e->engine->arena().huge_fraction();
  xpack::capi::copy_sized_out(out, v);
  return 0;
}

}  // extern "C"
