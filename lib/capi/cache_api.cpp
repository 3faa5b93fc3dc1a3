// The xpack_cache_* C API: an exception-free shell over cache::ExpertCache and a
// device backend chosen at creation.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "cache/expert_cache.h"
#include "capi/io_mode.h"
#include "capi/sized_struct.h"
#include "common/checked_math.h"
#include "common/handle_message.h"
#include "common/result.h"
#include "device/device.h"
#include "io/engine_defaults.h"
#include "xpack/xpack.h"

struct xpack_cache {
  std::unique_ptr<xpack::device::Device> device;
  std::unique_ptr<xpack::cache::ExpertCache> cache;
  xpack::HandleMessage errmsg;  // one message per calling thread
};

namespace {

using xpack::Error;
using xpack::Result;

int fail(const xpack_cache* c, int code, std::string msg) {
  return xpack::record_failure(c ? &c->errmsg : nullptr, code, std::move(msg));
}
int fail(const xpack_cache* c, const Error& e) { return fail(c, e.code, e.message); }

// The pack's geometry through its public accessors (the pack must outlive us).
Result<xpack::cache::ObjectSource> source_from_pack(xpack_pack* p) {
  xpack_pack_info info{};
  info.size = sizeof(info);
  int rc = xpack_pack_get_info(p, &info);
  if (rc != 0) return Error{rc, xpack_pack_errmsg(p)};
  xpack::cache::ObjectSource s;
  s.path = xpack_pack_path(p);
  s.n_layers = info.n_layers;
  s.n_experts = info.n_experts;
  s.top_k = info.n_experts_used;
  s.object_bytes = info.object_bytes;
  s.read_bytes = xpack::align_up(info.object_bytes, 4096);
  if (s.read_bytes > info.object_stride)
    return xpack::err(XPACK_E_MISALIGNED, "pack stride {} is smaller than the aligned object {}",
                      info.object_stride, s.read_bytes);
  s.offset = [p](uint32_t l, uint32_t e) {
    uint64_t off = 0;
    (void)xpack_pack_object_offset(p, l, e, &off);
    return off;
  };
  s.checksum = [p](uint32_t l, uint32_t e) {
    uint64_t h = 0;
    (void)xpack_pack_object_checksum(p, l, e, &h);
    return h;
  };
  return s;
}

Result<std::unique_ptr<xpack::device::Device>> make_device(const xpack_cache_options& o) {
  using namespace xpack::device;
  auto host = [&]() -> std::unique_ptr<Device> {
    HostDeviceOptions h;
    if (o.host_device_bytes) h.memory_bytes = o.host_device_bytes;
    return make_host_device(h);
  };
  switch (o.device) {
    case XPACK_DEVICE_HOST: return host();
    case XPACK_DEVICE_CUDA: return make_cuda_device(o.cuda_device);
    case XPACK_DEVICE_AUTO: {
      auto d = make_cuda_device(o.cuda_device);
      if (d.ok()) return d;
      return host();
    }
  }
  return xpack::err(XPACK_E_INVALID_ARG, "unknown device kind {}", o.device);
}

}  // namespace

extern "C" {

XPACK_API int xpack_cache_options_init(xpack_cache_options* opts) {
  if (!opts) return fail(nullptr, XPACK_E_INVALID_ARG, "null options");
  std::memset(opts, 0, sizeof(*opts));
  opts->size = sizeof(*opts);
  opts->policy = XPACK_POLICY_ADAPTIVE;
  opts->device = XPACK_DEVICE_AUTO;
  opts->staging_slots = xpack::io::kDefaultStagingBuffers;
  opts->read_splits = xpack::io::kDefaultReadSplits;
  opts->queue_depth = xpack::io::kDefaultQueueDepth;
  opts->direct_io = XPACK_IO_DIRECT;
  return 0;
}

XPACK_API int xpack_cache_create(xpack_pack* p, const xpack_cache_options* opts,
                                 xpack_cache** out) {
  if (!out) return fail(nullptr, XPACK_E_INVALID_ARG, "null output pointer");
  *out = nullptr;
  if (!p) return fail(nullptr, XPACK_E_INVALID_ARG, "null pack");
  if (opts && !xpack::capi::sized_struct_ok(opts))
    return fail(nullptr, XPACK_E_INVALID_ARG, "options size field not set");
  xpack_cache_options o;
  xpack_cache_options_init(&o);
  if (opts) xpack::capi::merge_sized_options(&o, *opts);
  xpack::cache::CacheOptions co;
  co.budget_bytes = o.budget_bytes;
  co.reserve_bytes = o.reserve_bytes;
  co.host_cache_bytes = o.host_cache_bytes;
  switch (o.policy) {
    case XPACK_POLICY_ADAPTIVE: co.policy = xpack::cache::PolicyKind::kAdaptive; break;
    case XPACK_POLICY_HYBRID: co.policy = xpack::cache::PolicyKind::kHybrid; break;
    case XPACK_POLICY_DECAY: co.policy = xpack::cache::PolicyKind::kDecay; break;
    case XPACK_POLICY_LRU: co.policy = xpack::cache::PolicyKind::kLru; break;
    case XPACK_POLICY_LFU: co.policy = xpack::cache::PolicyKind::kLfu; break;
    default: return fail(nullptr, XPACK_E_INVALID_ARG, "unknown cache policy " + std::to_string(o.policy));
  }
  co.staging_slots = o.staging_slots ? o.staging_slots : xpack::io::kDefaultStagingBuffers;
  co.read_splits = o.read_splits ? o.read_splits : xpack::io::kDefaultReadSplits;
  co.queue_depth = o.queue_depth ? o.queue_depth : xpack::io::kDefaultQueueDepth;
  auto direct = xpack::capi::direct_io_from(o.direct_io);
  if (!direct.ok()) return fail(nullptr, direct.error());
  co.direct_io = *direct;
  auto verify = xpack::capi::verify_from(o.verify);
  if (!verify.ok()) return fail(nullptr, verify.error());
  co.verify = *verify;
  if (o.stats_path) co.stats_path = o.stats_path;
  co.stats_interval = o.stats_interval;
  if (o.trace_path) co.trace_path = o.trace_path;

  auto src = source_from_pack(p);
  if (!src.ok()) return fail(nullptr, src.error());
  std::unique_ptr<xpack_cache> h(new (std::nothrow) xpack_cache);
  if (!h) return fail(nullptr, -ENOMEM, "out of memory");
  auto dev = make_device(o);
  if (!dev.ok()) return fail(nullptr, dev.error());
  h->device = std::move(*dev);
  auto cache = xpack::cache::ExpertCache::create(std::move(*src), *h->device, co);
  if (!cache.ok()) return fail(nullptr, cache.error());
  h->cache = std::move(*cache);
  *out = h.release();
  return 0;
}

XPACK_API void xpack_cache_destroy(xpack_cache* c) {
  if (!c) return;
  c->cache.reset();  // before the device it uses
  delete c;
}

XPACK_API const char* xpack_cache_errmsg(const xpack_cache* c) {
  if (!c) return "null cache";
  return c->errmsg.get();
}

XPACK_API int xpack_cache_get_info(const xpack_cache* c, xpack_cache_info* out) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!xpack::capi::sized_struct_ok(out)) return fail(c, XPACK_E_INVALID_ARG, "info struct missing or size not set");
  xpack_cache_info i{};
  i.size = sizeof(i);
  i.slot_count = c->cache->slot_count();
  i.n_layers = c->cache->source().n_layers;
  i.n_experts = c->cache->source().n_experts;
  i.slot_stride = c->cache->slot_stride();
  i.object_bytes = c->cache->object_bytes();
  i.device_backend = c->device->backend_name();
  i.policy = xpack::cache::policy_name(c->cache->policy());
  i.host_frames = c->cache->host_frame_count();
  i.host_frame_stride = i.host_frames ? c->cache->host_frame_stride() : 0;
  xpack::capi::copy_sized_out(out, i);
  return 0;
}

namespace {

xpack::Status check_slot_size(size_t elem_size, const char* call) {
  static_assert(sizeof(xpack_expert_slot) >= XPACK_EXPERT_SLOT_SIZE_V1);
  return xpack::capi::check_element_size(elem_size, XPACK_EXPERT_SLOT_SIZE_V1, call, "xpack_expert_slot");
}

xpack_expert_slot to_c(const xpack::cache::ExpertHandle& h) {
  return xpack_expert_slot{h.expert, h.slot, h.data, h.ready ? h.ready->native_handle() : nullptr,
                           h.hit ? 1 : 0, h.ready_recorded ? 1 : 0};
}

}  // namespace

XPACK_API int xpack_cache_acquire_ex(xpack_cache* c, uint32_t layer, const uint32_t* experts,
                                     size_t n, uint32_t n_tokens, uint32_t flags,
                                     xpack_expert_slot* out, size_t elem_size, uint64_t* ticket) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!out || !ticket) return fail(c, XPACK_E_INVALID_ARG, "null output pointer");
  *ticket = 0;
  if (auto st = check_slot_size(elem_size, "xpack_cache_acquire"); !st.ok()) return fail(c, st.error());
  if (flags & ~XPACK_ACQUIRE_DEFER)
    return fail(c, XPACK_E_INVALID_ARG, "unknown acquire flags " + std::to_string(flags));
  auto a = c->cache->acquire(layer, experts, n, n_tokens ? n_tokens : 1,
                             (flags & XPACK_ACQUIRE_DEFER) != 0);
  if (!a.ok()) return fail(c, a.error());
  for (size_t i = 0; i < n; ++i) xpack::capi::element_out(out, i, elem_size, to_c(a->experts[i]));
  *ticket = a->ticket;
  return 0;
}

XPACK_API int xpack_cache_acquire(xpack_cache* c, uint32_t layer, const uint32_t* experts,
                                  size_t n, uint32_t n_tokens, xpack_expert_slot* out,
                                  size_t elem_size, uint64_t* ticket) {
  return xpack_cache_acquire_ex(c, layer, experts, n, n_tokens, 0, out, elem_size, ticket);
}

XPACK_API int xpack_cache_entry(xpack_cache* c, uint64_t ticket, size_t index,
                                xpack_expert_slot* out, size_t elem_size) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!out) return fail(c, XPACK_E_INVALID_ARG, "null output pointer");
  if (auto st = check_slot_size(elem_size, "xpack_cache_entry"); !st.ok()) return fail(c, st.error());
  auto h = c->cache->entry(ticket, index);
  if (!h.ok()) return fail(c, h.error());
  xpack::capi::element_out(out, 0, elem_size, to_c(*h));
  return 0;
}

XPACK_API int xpack_cache_release_expert(xpack_cache* c, uint64_t ticket, size_t index,
                                         void* compute_stream) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  auto st = c->cache->release_expert(ticket, index, compute_stream);
  return st.ok() ? 0 : fail(c, st.error());
}

XPACK_API int xpack_cache_wait(xpack_cache* c, uint64_t ticket, size_t index) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  auto st = c->cache->wait(ticket, index);
  return st.ok() ? 0 : fail(c, st.error());
}

XPACK_API int xpack_cache_wait_all(xpack_cache* c, uint64_t ticket) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  auto st = c->cache->wait_all(ticket);
  return st.ok() ? 0 : fail(c, st.error());
}

XPACK_API int xpack_cache_acquire_blocking(xpack_cache* c, uint32_t layer,
                                           const uint32_t* experts, size_t n, uint32_t n_tokens,
                                           xpack_expert_slot* out, size_t elem_size,
                                           uint64_t* ticket) {
  int rc = xpack_cache_acquire(c, layer, experts, n, n_tokens, out, elem_size, ticket);
  if (rc != 0) return rc;
  auto st = c->cache->wait_all(*ticket);
  if (st.ok()) return 0;
  (void)c->cache->release(*ticket);
  *ticket = 0;
  return fail(c, st.error());
}

XPACK_API int xpack_cache_release(xpack_cache* c, uint64_t ticket, void* compute_stream) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  auto st = c->cache->release(ticket, compute_stream);
  return st.ok() ? 0 : fail(c, st.error());
}

XPACK_API int xpack_cache_prefetch(xpack_cache* c, uint32_t layer, const uint32_t* experts,
                                   size_t n) {
  return xpack_cache_prefetch_ex(c, layer, experts, n, 0);
}

XPACK_API int xpack_cache_prefetch_ex(xpack_cache* c, uint32_t layer, const uint32_t* experts,
                                      size_t n, uint32_t flags) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (flags & ~XPACK_PREFETCH_CERTAIN)
    return fail(c, XPACK_E_INVALID_ARG, "unknown prefetch flags " + std::to_string(flags));
  auto r = c->cache->prefetch(layer, experts, n, (flags & XPACK_PREFETCH_CERTAIN) != 0);
  if (!r.ok()) return fail(c, r.error());
  return int(std::min<size_t>(*r, INT32_MAX));
}

XPACK_API int xpack_cache_slot_pointer(const xpack_cache* c, uint32_t slot, void** ptr) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!ptr) return fail(c, XPACK_E_INVALID_ARG, "null output pointer");
  if (slot >= c->cache->slot_count())
    return fail(c, XPACK_E_INVALID_ARG, "slot " + std::to_string(slot) + " out of range");
  *ptr = c->cache->slot_data(slot);
  return 0;
}

XPACK_API int xpack_cache_read_slot(xpack_cache* c, uint32_t slot, void* dst, size_t dst_size) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!dst || dst_size < c->cache->object_bytes())
    return fail(c, XPACK_E_INVALID_ARG, "destination missing or smaller than one object");
  if (slot >= c->cache->slot_count())
    return fail(c, XPACK_E_INVALID_ARG, "slot " + std::to_string(slot) + " out of range");
  auto st = c->device->copy_to_host(dst, c->cache->slot_data(slot), c->cache->object_bytes());
  return st.ok() ? 0 : fail(c, st.error());
}

XPACK_API int xpack_cache_get_counters(const xpack_cache* c, xpack_cache_counters* out) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!xpack::capi::sized_struct_ok(out)) return fail(c, XPACK_E_INVALID_ARG, "counters struct missing or size not set");
  auto s = c->cache->counters();
  xpack_cache_counters k{};
  k.size = sizeof(k);
  k.cache_hits = s.cache_hits;
  k.cache_misses = s.cache_misses;
  k.cache_evictions = s.cache_evictions;
  k.pack_reads = s.pack_reads;
  k.pack_read_bytes = s.pack_read_bytes;
  k.h2d_bytes = s.h2d_bytes;
  k.fallback_count = s.fallback_count;
  k.io_errors = s.io_errors;
  k.prefetch_issued = s.prefetch_issued;
  k.prefetch_used = s.prefetch_used;
  k.prefetch_wasted = s.prefetch_wasted;
  k.acquires = s.acquires;
  k.steps = s.steps;
  k.stall_ns = s.stall_ns;
  k.stall_waits = s.stall_waits;
  k.read_p50_ns = s.read_latency.quantile_ns(0.5);
  k.read_p99_ns = s.read_latency.quantile_ns(0.99);
  k.h2d_p50_ns = s.h2d_latency.quantile_ns(0.5);
  k.h2d_p99_ns = s.h2d_latency.quantile_ns(0.99);
  k.n_layers = uint32_t(s.route_calls_by_layer.size());
  k.trace_write_errors = s.trace_write_errors;
  k.staging_page_bytes = s.staging_page_bytes;
  k.staging_huge_fraction = s.staging_huge_fraction;
  k.host_hits = s.host_hits;
  k.host_demotions = s.host_demotions;
  k.host_evictions = s.host_evictions;
  k.d2h_bytes = s.d2h_bytes;
  k.ssd_busy_ns = s.ssd_busy_ns;
  xpack::capi::copy_sized_out(out, k);
  return 0;
}

XPACK_API int xpack_cache_get_layer_counters(const xpack_cache* c, uint32_t layer,
                                             xpack_layer_counters* out) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  if (!xpack::capi::sized_struct_ok(out))
    return fail(c, XPACK_E_INVALID_ARG, "layer counters struct missing or size not set");
  auto s = c->cache->counters();
  if (layer >= s.route_calls_by_layer.size())
    return fail(c, XPACK_E_INVALID_ARG,
                "layer " + std::to_string(layer) + " out of range (" +
                    std::to_string(s.route_calls_by_layer.size()) + " layers)");
  xpack_layer_counters k{};
  k.size = sizeof(k);
  k.route_calls = s.route_calls_by_layer[layer];
  k.route_tokens = s.route_tokens_by_layer[layer];
  k.hits = s.hits_by_layer[layer];
  k.misses = s.misses_by_layer[layer];
  xpack::capi::copy_sized_out(out, k);
  return 0;
}

XPACK_API int xpack_cache_write_stats(xpack_cache* c) {
  if (!c) return fail(nullptr, XPACK_E_INVALID_ARG, "null cache");
  auto st = c->cache->write_stats();
  return st.ok() ? 0 : fail(c, st.error());
}

}  // extern "C"
