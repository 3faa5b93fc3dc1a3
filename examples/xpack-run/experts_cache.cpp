// Routed experts from an Expert Pack through libxpack's expert cache
// (xpack_cache_*: io_uring reads into staging, byte-budgeted slots, the
// adaptive eviction, doc/cache.md). The backend computes on the slots in place: the
// CPU backend on a host-device cache, the CUDA backend on a CUDA one, whose
// per-expert ready events its compute stream waits on (no host wait).
//
// A layer's request can name more distinct experts than the cache has slots
// (prefill of a long batch on a small budget). Routing is never altered: the
// request is one deferred acquire (XPACK_ACQUIRE_DEFER), and the experts stream
// through the slots in order: wait for expert i, compute with it in place,
// release it, and its slot takes a later expert while the next ones compute.
// Nothing is copied out of the slots, and a routing trace sees one request per
// layer and step.
#include <cstdio>
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experts_factory.h"
#include "pack_roles.h"
#include "xpack/xpack.h"

namespace xrun {

namespace {

class CacheExperts final : public CacheExpertSource {
 public:
  CacheExperts(xpack_pack* pack, std::vector<PackRole> roles, const PackSourceOptions& opts)
      : pack_(pack), roles_(std::move(roles)), opts_(opts), pack_path_(opts.pack_path) {
    xpack_pack_info pi{};
    pi.size = sizeof(pi);
    xpack_pack_get_info(pack_, &pi);
    top_k_ = pi.n_experts_used;
    n_experts_ = static_cast<int>(pi.n_experts);
    object_bytes_ = pi.object_bytes;
  }

  ~CacheExperts() override {
    xpack_cache_destroy(cache_);
    xpack_pack_close(pack_);
  }

  bool create_cache(std::string* why_not, bool* capacity) override;
  uint32_t top_k() const override { return top_k_; }
  uint64_t object_bytes() const override { return slot_stride_ ? slot_stride_ : object_bytes_; }
  uint32_t slot_count() const override { return slot_count_; }

  bool has_layer(int layer) const override {
    uint32_t slot = 0;
    return layer >= 0 && xpack_pack_layer_slot(pack_, static_cast<uint32_t>(layer), &slot) == 0;
  }
  int n_experts() const override { return n_experts_; }

  std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n, void* compute_stream) override {
    if (!cache_) throw ModelError("expert cache: acquire before create_cache");
    uint32_t lslot = 0;
    if (layer < 0 || xpack_pack_layer_slot(pack_, static_cast<uint32_t>(layer), &lslot) != 0) {
      throw ModelError("expert pack has no layer " + std::to_string(layer));
    }
    std::vector<uint32_t> ids(static_cast<size_t>(std::max(n, 0)));
    for (int i = 0; i < n; ++i) {
      if (experts[i] < 0 || experts[i] >= n_experts_) throw ModelError("expert id " + std::to_string(experts[i]) + " out of range");
      ids[i] = static_cast<uint32_t>(experts[i]);
      for (int j = 0; j < i; ++j)
        if (ids[j] == ids[i]) throw ModelError("expert " + std::to_string(ids[i]) + " requested twice in one layer");
    }
    auto req = std::make_unique<CacheRequest>(this, layer, compute_stream);
    if (n <= 0) return req;
    // Models hand over a layer's distinct experts, not the token count. A request
    // no wider than top-k is taken as one decode token, a wider one as prefill:
    // xpack-sim classifies trace groups by the same rule, so the live cache and
    // a replay of its trace break the hybrid policy's ties the same way.
    const uint32_t n_tokens = static_cast<uint32_t>(n) <= top_k_ ? 1u : static_cast<uint32_t>(n);
    req->entries.resize(static_cast<size_t>(n));
    req->views.resize(static_cast<size_t>(n));
    check(xpack_cache_acquire_ex(cache_, lslot, ids.data(), ids.size(), n_tokens, XPACK_ACQUIRE_DEFER,
                                 req->entries.data(), sizeof(xpack_expert_slot), &req->ticket),
          layer);
    req->held = true;
    for (const auto& e : req->entries) deferred_experts_ += e.slot == XPACK_SLOT_DEFERRED;
    if (!opts_.overlap) {
      // --no-overlap: the layer's compute starts only after its last read, as in
      // an engine that loads a layer's experts and then computes (the seed's).
      // Every placed entry is then resident; deferred ones still stream (they
      // wait for a slot an earlier expert of this request frees).
      for (size_t i = 0; i < req->entries.size(); ++i) {
        if (req->entries[i].slot == XPACK_SLOT_DEFERRED || req->entries[i].hit) continue;
        check(xpack_cache_wait(cache_, req->ticket, i), layer);
      }
      req->loaded = true;
    }
    return req;
  }

  void prefetch(int layer, const int32_t* experts, int n) override { hint(layer, experts, n, XPACK_PREFETCH_CERTAIN); }
  void prefetch_guess(int layer, const int32_t* experts, int n) override { hint(layer, experts, n, 0); }

  void hint(int layer, const int32_t* experts, int n, uint32_t flags) {
    if (!cache_) throw ModelError("expert cache: prefetch before create_cache");
    ExpertSource::prefetch(layer, experts, n);
    if (n <= 0) return;
    uint32_t lslot = 0;
    xpack_pack_layer_slot(pack_, static_cast<uint32_t>(layer), &lslot);
    const std::vector<uint32_t> ids(experts, experts + n);
    // The cache starts only the loads it has room for and counts them in
    // prefetch_issued (a guess: free slots or entries its policy values no
    // more; an exact hint: over the policy's victim, in at most half the
    // slots); the rest are read by the acquire as usual.
    const int rc = xpack_cache_prefetch_ex(cache_, lslot, ids.data(), ids.size(), flags);
    if (rc < 0) check(rc, layer);
  }

  void finish() override {
    if (!cache_) return;
    int rc = xpack_cache_write_stats(cache_);
    xpack_cache_counters c{};
    c.size = sizeof(c);
    xpack_cache_get_counters(cache_, &c);
    if (rc != 0 || c.trace_write_errors != 0) {
      throw ModelError(std::string("--trace: the routing trace could not be written completely (") +
                       std::to_string(c.trace_write_errors) + " failed writes): " +
                       (rc != 0 ? xpack_cache_errmsg(cache_) : "") );
    }
  }

  uint64_t device_bytes() const override { return on_device_ ? slot_bytes_ : 0; }

  nlohmann::ordered_json counters_json() const override {
    if (!cache_) return nlohmann::ordered_json::object();
    xpack_cache_counters c{};
    c.size = sizeof(c);
    xpack_cache_get_counters(cache_, &c);
    return {{"source", "pack-cache"},
            {"cache_hits", c.cache_hits},
            {"cache_misses", c.cache_misses},
            {"cache_evictions", c.cache_evictions},
            {"pack_reads", c.pack_reads},
            {"pack_read_bytes", c.pack_read_bytes},
            {"h2d_bytes", c.h2d_bytes},
            {"fallback_count", c.fallback_count},
            {"io_errors", c.io_errors},
            {"acquires", c.acquires},
            {"steps", c.steps},
            {"stall_ns", c.stall_ns},
            {"prefetch_issued", c.prefetch_issued},
            {"prefetch_used", c.prefetch_used},
            {"prefetch_wasted", c.prefetch_wasted},
            {"trace_write_errors", c.trace_write_errors},
            {"read_p50_ns", c.read_p50_ns},
            {"read_p99_ns", c.read_p99_ns},
            {"h2d_p50_ns", c.h2d_p50_ns},
            {"h2d_p99_ns", c.h2d_p99_ns},
            {"budget_objects", slot_count_},
            {"object_bytes", object_bytes_},
            {"n_experts_used", top_k_},
            {"deferred_experts", deferred_experts_},
            {"host_hits", c.host_hits},
            {"host_demotions", c.host_demotions},
            {"host_evictions", c.host_evictions},
            {"d2h_bytes", c.d2h_bytes},
            {"ssd_busy_ns", c.ssd_busy_ns},
            {"host_frames", host_frames_},
            {"host_bytes", host_bytes_},
            {"staging_page_bytes", c.staging_page_bytes},
            {"staging_huge_fraction", c.staging_huge_fraction},
            {"cache_policy", policy_},
            {"overlap", opts_.overlap}};
  }

 private:
  // One ticket. Its deferred entries take the slots of released ones, in order.
  struct CacheRequest final : ExpertRequest {
    CacheRequest(CacheExperts* s, int l, void* stream) : source(s), layer(l), compute_stream(stream) {}
    ~CacheRequest() override {
      if (held) xpack_cache_release(source->cache_, ticket, compute_stream);
    }
    bool resident(int i) const override {
      const xpack_expert_slot& e = entries.at(static_cast<size_t>(i));
      return e.slot != XPACK_SLOT_DEFERRED && (e.hit || loaded);
    }
    ExpertReady get(int i) override {
      const size_t idx = static_cast<size_t>(i);
      // A host cache publishes no events, and a deferred entry has no slot
      // yet: both need the host to wait for the entry. So does an expert whose
      // ready event is not recorded yet: a miss, or a hit on an expert still
      // being read (a prefetch in flight, common for the hash layers' exact
      // prefetch): the event is recorded only once the read has landed and
      // the copy is enqueued, and a stream wait before that record waits for
      // nothing (the C API has no "copy enqueued" wait). The host then waits
      // for this expert's read and copy, never for the compute stream;
      // otherwise the compute stream alone waits on the event.
      xpack_expert_slot e{};
      source->check(xpack_cache_entry(source->cache_, ticket, idx, &e, sizeof e), layer);
      if (e.slot == XPACK_SLOT_DEFERRED || !e.ready_event || !(e.ready_recorded || loaded)) {
        source->check(xpack_cache_wait(source->cache_, ticket, idx), layer);
        source->check(xpack_cache_entry(source->cache_, ticket, idx, &e, sizeof e), layer);
      }
      object_views(source->roles_, e.data, static_cast<int>(e.expert), views[idx]);
      return {&views[idx], e.ready_event};
    }
    void release(int i) override {
      source->check(xpack_cache_release_expert(source->cache_, ticket, static_cast<size_t>(i), compute_stream), layer);
    }
    // Deferred entries take the slots of released ones (xpack_cache_release_expert).
    bool waits_for_released() const override {
      for (const xpack_expert_slot& e : entries)
        if (e.slot == XPACK_SLOT_DEFERRED) return true;
      return false;
    }

    CacheExperts* source;
    int layer;
    void* compute_stream;
    uint64_t ticket = 0;
    bool held = false;
    bool loaded = false;  // --no-overlap: every placed entry was waited for in acquire()
    std::vector<xpack_expert_slot> entries;  // as acquired
    std::vector<ExpertWeights> views;
  };

  void check(int rc, int layer) {
    if (rc != 0) {
      throw ModelError("expert cache: loading experts of layer " + std::to_string(layer) + " from " + pack_path_ +
                       " failed: " + xpack_cache_errmsg(cache_) + " (" + xpack_strerror(rc) + ")");
    }
  }

  xpack_pack* pack_;
  xpack_cache* cache_ = nullptr;
  std::vector<PackRole> roles_;
  PackSourceOptions opts_;
  std::string pack_path_;
  uint32_t slot_count_ = 0;
  uint64_t slot_stride_ = 0;
  int n_experts_ = 0;
  uint64_t object_bytes_ = 0;
  uint32_t top_k_ = 0;
  uint64_t deferred_experts_ = 0;  // experts that waited for a slot inside their request
  uint64_t slot_bytes_ = 0;
  uint32_t host_frames_ = 0;
  std::string policy_;  // the cache's own name for its eviction policy
  uint64_t host_bytes_ = 0;  // pinned host memory of the tier
  bool on_device_ = false;
};

bool CacheExperts::create_cache(std::string* why_not, bool* capacity) {
  if (capacity) *capacity = false;
  if (cache_) return true;
  const PackSourceOptions& o = opts_;
  xpack_cache_options co{};
  xpack_cache_options_init(&co);
  co.budget_bytes = o.budget_bytes;
  co.reserve_bytes = o.reserve_bytes;
  co.host_cache_bytes = o.host_cache_bytes;
  const uint64_t frame = (object_bytes_ + 4095) / 4096 * 4096;
  if (o.host_cache_is_default && co.host_cache_bytes < 2 * frame) co.host_cache_bytes = 0;
  // Each backend computes on the slots in place: host memory for the CPU,
  // VRAM for CUDA (its ready events are waited on by the compute stream).
  co.device = o.cuda ? XPACK_DEVICE_CUDA : XPACK_DEVICE_HOST;
  co.verify = o.verify ? XPACK_VERIFY_ON : XPACK_VERIFY_OFF;
  co.direct_io = XPACK_IO_DIRECT;
  co.trace_path = o.trace_path.empty() ? nullptr : o.trace_path.c_str();
  co.policy = o.policy;
  co.read_splits = o.read_splits;
  co.queue_depth = o.queue_depth;
  int rc = xpack_cache_create(pack_, &co, &cache_);
  if (rc == XPACK_E_NO_DIRECT_IO) {
    // Fail closed: reading through the page cache doubles every expert's memory
    // traffic and hides the disk's real speed, so it is never silent.
    if (!o.allow_buffered_io) {
      throw ModelError("the filesystem of " + o.pack_path + " refuses O_DIRECT reads (" + xpack_last_error() +
                       "); put the pack on a disk filesystem, or pass --allow-buffered-io to read "
                       "experts through the page cache");
    }
    std::fprintf(stderr,
                 "xpack-run: warning: %s refuses O_DIRECT; reading experts through the page cache "
                 "(--allow-buffered-io)\n",
                 o.pack_path.c_str());
    co.direct_io = XPACK_IO_BUFFERED;
    rc = xpack_cache_create(pack_, &co, &cache_);
  }
  if (rc != 0) {
    cache_ = nullptr;
    if (why_not) *why_not = std::string(xpack_last_error()) + " (" + xpack_strerror(rc) + ")";
    if (capacity) *capacity = rc == XPACK_E_CAPACITY;
    return false;
  }
  xpack_cache_info info{};
  info.size = sizeof(info);
  xpack_cache_get_info(cache_, &info);
  slot_count_ = info.slot_count;
  slot_stride_ = info.slot_stride;
  slot_bytes_ = uint64_t(info.slot_count) * info.slot_stride;
  host_frames_ = info.host_frames;
  policy_ = info.policy ? info.policy : "";
  host_bytes_ = uint64_t(info.host_frames) * info.host_frame_stride;
  on_device_ = info.device_backend && std::string(info.device_backend) == "cuda";
  return true;
}

}  // namespace

std::unique_ptr<CacheExpertSource> open_cache_experts(const PackSourceOptions& o, int n_expected_experts) {
  xpack_pack_options popts{};
  popts.size = sizeof(popts);
  popts.trunk_path = o.trunk_path.empty() ? nullptr : o.trunk_path.c_str();
  xpack_pack* pack = nullptr;
  int rc = xpack_pack_open(o.pack_path.c_str(), &popts, &pack);
  if (rc != 0) {
    throw ModelError("cannot open expert pack " + o.pack_path + ": " + xpack_last_error() + " (" +
                     xpack_strerror(rc) + ")");
  }
  xpack_pack_info info{};
  info.size = sizeof(info);
  xpack_pack_get_info(pack, &info);
  if (n_expected_experts > 0 && static_cast<uint32_t>(n_expected_experts) != info.n_experts) {
    xpack_pack_close(pack);
    throw ModelError("expert pack has " + std::to_string(info.n_experts) + " experts per layer, the model " +
                     std::to_string(n_expected_experts));
  }
  std::vector<PackRole> roles;
  try {
    roles = pack_roles(pack, o.pack_path);
  } catch (...) {
    xpack_pack_close(pack);
    throw;
  }
  return std::make_unique<CacheExperts>(pack, std::move(roles), o);
}

std::unique_ptr<ExpertSource> make_cache_experts(const PackSourceOptions& o, int n_expected_experts,
                                                 std::string* why_not) {
  std::unique_ptr<CacheExpertSource> source = open_cache_experts(o, n_expected_experts);
  if (!source->create_cache(why_not, nullptr)) return nullptr;
  return source;
}

}  // namespace xrun
