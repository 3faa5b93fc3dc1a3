// Routed experts from an Expert Pack through libxpack's public C API, held in
// a byte-budgeted host cache (least recently used object evicted first).
// A layer's objects are all loaded (in parallel) and pinned while the model
// computes with them, so a request is always served in full even when it is
// larger than the budget: routing is never altered to fit the cache.
#include <chrono>
#include <cstdlib>
#include <list>
#include <memory>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "experts_factory.h"
#include "pack_roles.h"
#include "worker_pool.h"
#include "xpack/xpack.h"

namespace xrun {

namespace {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, AlignedFree>;


class PackExperts final : public ExpertSource {
 public:
  PackExperts(const PackSourceOptions& o, int n_expected_experts) : opts_(o), read_pool_(o.threads) {
    xpack_pack_options popts{};
    popts.size = sizeof(popts);
    popts.trunk_path = o.trunk_path.empty() ? nullptr : o.trunk_path.c_str();
    int rc = xpack_pack_open(o.pack_path.c_str(), &popts, &pack_);
    if (rc != 0) {
      throw ModelError("cannot open expert pack " + o.pack_path + ": " + xpack_last_error() + " (" +
                       xpack_strerror(rc) + ")");
    }
    xpack_pack_info info{};
    info.size = sizeof(info);
    check(xpack_pack_get_info(pack_, &info), "pack info");
    n_experts_ = static_cast<int>(info.n_experts);
    n_layers_ = info.n_layers;
    top_k_ = info.n_experts_used;
    object_bytes_ = info.object_bytes;
    if (n_expected_experts > 0 && n_expected_experts != n_experts_) {
      throw ModelError("expert pack has " + std::to_string(n_experts_) + " experts per layer, the model " +
                       std::to_string(n_expected_experts));
    }
    roles_ = pack_roles(pack_, o.pack_path);
    alloc_bytes_ = (object_bytes_ + 4095) / 4096 * 4096;
    budget_objects_ = o.budget_bytes / alloc_bytes_;
  }

  ~PackExperts() override { xpack_pack_close(pack_); }

  bool has_layer(int layer) const override {
    uint32_t slot = 0;
    return layer >= 0 && xpack_pack_layer_slot(pack_, static_cast<uint32_t>(layer), &slot) == 0;
  }
  int n_experts() const override { return n_experts_; }

  std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n, void*) override {
    auto req = std::make_unique<PinnedRequest>(this, layer);
    load(layer, experts, n, req->experts);
    return req;
  }

 private:
  // A layer's objects, all loaded by acquire and pinned until the request ends.
  struct PinnedRequest final : ExpertRequest {
    PinnedRequest(PackExperts* s, int l) : source(s), layer(l) {}
    ~PinnedRequest() override { source->release(layer); }
    bool resident(int) const override { return true; }
    ExpertReady get(int i) override { return {&experts.at(static_cast<size_t>(i)), nullptr}; }
    void release(int) override {}
    PackExperts* source;
    int layer;
    std::vector<ExpertWeights> experts;
  };

  void load(int layer, const int32_t* experts, int n, std::vector<ExpertWeights>& out) {
    uint32_t slot = 0;
    if (layer < 0 || xpack_pack_layer_slot(pack_, static_cast<uint32_t>(layer), &slot) != 0) {
      throw ModelError("expert pack has no layer " + std::to_string(layer));
    }
    out.clear();
    if (n <= 0) return;
    ++acquire_calls_;
    std::vector<Entry*> entries(static_cast<size_t>(n), nullptr);
    std::vector<std::pair<Entry*, int>> misses;
    // Hits first: pin them so that making room for misses cannot evict them.
    for (int i = 0; i < n; ++i) {
      int e = experts[i];
      if (e < 0 || e >= n_experts_) throw ModelError("expert id " + std::to_string(e) + " out of range");
      uint64_t key = uint64_t(slot) * uint64_t(n_experts_) + uint64_t(e);
      auto it = map_.find(key);
      if (it != map_.end()) {
        Entry* en = &*it->second;
        lru_.splice(lru_.end(), lru_, it->second);  // most recently used at the back
        en->pinned_layer = layer;
        entries[i] = en;
        ++hits_;
      }
    }
    for (int i = 0; i < n; ++i) {
      if (entries[i]) continue;
      uint64_t key = uint64_t(slot) * uint64_t(n_experts_) + uint64_t(experts[i]);
      Buffer buf = make_room();
      lru_.push_back(Entry{key, std::move(buf), layer});
      auto pos = std::prev(lru_.end());
      map_[key] = pos;
      entries[i] = &*pos;
      misses.emplace_back(&*pos, experts[i]);
      ++misses_;
    }
    // Misses are read in parallel: xpack_pack_read_object is a thread-safe pread.
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int> rcs(misses.size(), 0);
    read_pool_.parallel_for(static_cast<int64_t>(misses.size()), 0, [&](int64_t b, int64_t end) {
      for (int64_t m = b; m < end; ++m) {
        rcs[m] = xpack_pack_read_object(pack_, slot, static_cast<uint32_t>(misses[m].second),
                                        misses[m].first->buf.get(), alloc_bytes_, opts_.verify ? 1 : 0);
      }
    });
    read_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    for (size_t m = 0; m < misses.size(); ++m) {
      if (rcs[m] != 0) {
        ++read_errors_;
        // Never keep a half-read object in the cache.
        drop(misses[m].first->key);
        throw ModelError("reading expert " + std::to_string(misses[m].second) + " of layer " +
                         std::to_string(layer) + " from " + opts_.pack_path + " failed: " + xpack_pack_errmsg(pack_) +
                         " (" + xpack_strerror(rcs[m]) + ")");
      }
      read_bytes_ += object_bytes_;
    }
    out.clear();
    out.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) object_views(roles_, entries[i]->buf.get(), experts[i], out[i]);
    peak_objects_ = std::max<uint64_t>(peak_objects_, lru_.size());
  }

  void release(int layer) {
    for (Entry& e : lru_) {
      if (e.pinned_layer == layer) e.pinned_layer = kUnpinned;
    }
  }


 public:
  nlohmann::ordered_json counters_json() const override {
    return {{"source", "pack-direct"},
            {"cache_hits", hits_},
            {"cache_misses", misses_},
            {"cache_evictions", evictions_},
            {"pack_read_bytes", read_bytes_},
            {"read_ns", read_ns_},
            {"io_errors", read_errors_},
            {"acquire_calls", acquire_calls_},
            {"budget_bytes", opts_.budget_bytes},
            {"budget_objects", budget_objects_},
            {"object_bytes", object_bytes_},
            {"peak_resident_objects", peak_objects_},
            {"n_layers", n_layers_},
            {"n_experts_used", top_k_}};
  }

 private:
  static constexpr int kUnpinned = -1 << 30;
  struct Entry {
    uint64_t key;
    Buffer buf;
    int pinned_layer;
  };

  void check(int rc, const char* what) {
    if (rc != 0) throw ModelError(std::string(what) + ": " + xpack_pack_errmsg(pack_) + " (" + xpack_strerror(rc) + ")");
  }

  // A buffer for one more object: evicts unpinned objects (oldest first) while
  // the cache is at its budget, reusing the evicted memory.
  Buffer make_room() {
    Buffer reuse;
    while (lru_.size() >= budget_objects_) {
      auto victim = lru_.end();
      for (auto it = lru_.begin(); it != lru_.end(); ++it) {
        if (it->pinned_layer == kUnpinned) {
          victim = it;
          break;
        }
      }
      if (victim == lru_.end()) break;  // everything pinned: go over budget for this request
      map_.erase(victim->key);
      if (!reuse) reuse = std::move(victim->buf);
      lru_.erase(victim);
      ++evictions_;
    }
    if (reuse) return reuse;
    void* p = std::aligned_alloc(4096, alloc_bytes_);
    if (!p) throw ModelError("out of memory allocating an expert buffer");
    return Buffer(static_cast<uint8_t*>(p));
  }

  void drop(uint64_t key) {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    lru_.erase(it->second);
    map_.erase(it);
  }

  PackSourceOptions opts_;
  WorkerPool read_pool_;
  xpack_pack* pack_ = nullptr;
  int n_experts_ = 0;
  uint64_t n_layers_ = 0, top_k_ = 0;
  uint64_t object_bytes_ = 0, alloc_bytes_ = 0, budget_objects_ = 0;
  std::vector<PackRole> roles_;
  std::list<Entry> lru_;
  std::unordered_map<uint64_t, std::list<Entry>::iterator> map_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, read_bytes_ = 0, read_ns_ = 0, read_errors_ = 0;
  uint64_t acquire_calls_ = 0, peak_objects_ = 0;
};

}  // namespace

std::unique_ptr<ExpertSource> make_pack_experts(const PackSourceOptions& opts, int n_expected_experts) {
  return std::make_unique<PackExperts>(opts, n_expected_experts);
}

}  // namespace xrun
