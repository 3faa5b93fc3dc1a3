// Where routed experts come from: the Expert Pack through libxpack (streamed,
// cached) or, for a plain unconverted GGUF, the GGUF's own 3-D expert tensors.
// Models never see the difference: every source hands out the same bytes.
//
// The interface is asynchronous so that a GPU backend never blocks the host on
// an expert: acquire() starts the loads of a layer's experts and returns at
// once; each expert then comes with the event its bytes are ready at, which the
// compute stream waits on, and is released on the compute stream once the
// work reading it is enqueued. routed_experts.h is the one user.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tensor.h"

namespace xrun {

// The roles of one (layer, expert) object, looked up by role name.
struct ExpertWeights {
  int expert = -1;
  // Role names as in the GGUF tensor name: "gate", "up", "down", "gate_up".
  // Each a 2-D matrix, ne[0] inputs x ne[1] outputs, viewing the source's
  // memory (a device address for a device cache).
  const Tensor* role(const char* name) const;
  std::vector<std::pair<std::string, Tensor>> roles;
};

// An expert of a request, usable once the compute stream waited on ready_event.
struct ExpertReady {
  const ExpertWeights* weights = nullptr;  // valid until the expert is released
  void* ready_event = nullptr;             // cudaEvent_t; nullptr when the bytes are already there
};

// The experts of one acquire, indexed as requested. Destroying it releases
// whatever is still held, on the compute stream given to acquire().
class ExpertRequest {
 public:
  virtual ~ExpertRequest() = default;
  // True if expert i was resident when acquired: the dispatcher computes those
  // first, while the others are still loading.
  virtual bool resident(int i) const = 0;
  // Expert i's weights. Waits on the host only where the source must (an
  // entry that waits for cache space, a host-memory cache); a failed load
  // throws ModelError.
  virtual ExpertReady get(int i) = 0;
  // Work that reads expert i is enqueued on the compute stream; its memory
  // may take another expert once that work is done.
  virtual void release(int i) = 0;
  // Whether releasing experts one by one lets this request go faster: some of
  // its experts wait for the memory of others. Where none does, the request's
  // own end releases them all at once (a CUDA cache orders each release after
  // the compute stream: three driver calls an expert, ~36 per decode step).
  virtual bool waits_for_released() const { return true; }
};

class ExpertSource;
// Loads every routed expert of GGUF blocks [0, n_blocks) once, a layer at a time, and
// returns how many: runs with every expert resident (bench/e2e.sh's (d)) then compute
// from the same memory as streamed runs, with no read left inside a token. Throws
// ModelError when the source could not keep them all (it evicted some).
int64_t preload_experts(ExpertSource& source, int n_blocks);

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // True if GGUF block `layer` has routed experts.
  virtual bool has_layer(int layer) const = 0;
  virtual int n_experts() const = 0;
  // Starts loading the `n` distinct experts of `layer` (an id out of range
  // throws ModelError) and returns at once. Every requested expert is
  // delivered, never skipped, even when there are more than the source holds
  // at once: those beyond its room are placed, in request order, as earlier
  // ones are released, so a caller must release the experts it is done with
  // before it gets one beyond that room. `compute_stream`: Backend::stream().
  virtual std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n,
                                                 void* compute_stream) = 0;
  // An exact hint, never a guess: `layer` will acquire these `n` distinct
  // experts (ids as acquire() takes them) later in this step, e.g. the
  // hash-routed layers' experts, known from the token ids alone. A source that
  // reads asynchronously starts their loads now, so they overlap the compute
  // before that layer; what acquire() delivers is unchanged either way. An id
  // or layer out of range throws ModelError. The default only checks them:
  // nothing to start where experts are in memory or read on acquire.
  virtual void prefetch(int layer, const int32_t* experts, int n);
  // A guess (--prefetch-next): experts `layer` may acquire. A source may start
  // them at a lower standing than prefetch()'s exact hints (the expert cache
  // lets a guess displace only what its policy values no more). The default
  // treats it as prefetch() does.
  virtual void prefetch_guess(int layer, const int32_t* experts, int n) { ExpertSource::prefetch(layer, experts, n); }
  // Called once after the run: reports what could only fail late (an
  // incomplete routing trace) by throwing ModelError.
  virtual void finish() {}
  // Engine counters as a JSON object (for --json / --stats); empty by default.
  virtual nlohmann::ordered_json counters_json() const;
  // Device memory the source holds for experts (a CUDA cache's slots), for
  // the VRAM plan; 0 for host memory.
  virtual uint64_t device_bytes() const { return 0; }
};

}  // namespace xrun
