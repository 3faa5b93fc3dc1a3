// Constructors of the two ExpertSource implementations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend.h"
#include "experts.h"
#include "weights.h"

namespace xrun {

struct PackSourceOptions {
  std::string pack_path;
  std::string trunk_path;      // checked against the pack's identity ("" = no check)
  uint64_t budget_bytes = 0;   // expert cache budget (0: the device's free memory minus reserve_bytes)
  uint64_t reserve_bytes = 0;  // device memory the cache leaves free (KV growth, activations, workspace)
  uint64_t host_cache_bytes = 0;  // the cache's host-RAM tier (0 = none)
  // host_cache_bytes is a default, not a request: below two objects (the least
  // tier the cache takes) it becomes no tier instead of an error.
  bool host_cache_is_default = false;
  bool verify = true;          // xxh3 of every object read
  bool allow_buffered_io = false;  // O_DIRECT refused: page cache, with a warning (else an error)
  std::string trace_path;      // routing trace CSV written by the cache ("" = none)
  int threads = 0;             // parallel reads of the direct reader (0 = all cores)
  bool cuda = false;           // cache slots in VRAM (XPACK_DEVICE_CUDA), for the CUDA backend
  int32_t policy = 0;          // enum xpack_cache_policy (0 = adaptive)
  bool overlap = true;         // false: acquire() returns once every expert is loaded (--no-overlap)
  uint32_t read_splits = 0;    // xpack_cache_options.read_splits (0 = libxpack's default)
  uint32_t queue_depth = 0;    // xpack_cache_options.queue_depth (0 = libxpack's default)
};

// Experts served from an Expert Pack through libxpack's C API, kept in a
// byte-budgeted cache; experts that do not fit are read again when next used.
std::unique_ptr<ExpertSource> make_pack_experts(const PackSourceOptions& opts, int n_expected_experts);

// The same through libxpack's expert cache (xpack_cache_*), made in two
// steps: open() reads the pack (a model can be built on it: has_layer and
// n_experts work), create_cache() then sizes the cache. On a GPU the default
// budget is the VRAM left free once the trunk and the state are allocated, so
// the cache must be made after the model.
class CacheExpertSource : public ExpertSource {
 public:
  // Makes the cache. False, with the reason in *why_not, when it cannot be
  // made for this budget (fewer slots than top-k; *capacity is then true);
  // other failures throw ModelError.
  virtual bool create_cache(std::string* why_not, bool* capacity) = 0;
  virtual uint32_t top_k() const = 0;
  // The device memory of one cache slot (an object, aligned).
  virtual uint64_t object_bytes() const = 0;
  virtual uint32_t slot_count() const = 0;  // 0 before create_cache
};
std::unique_ptr<CacheExpertSource> open_cache_experts(const PackSourceOptions& opts, int n_expected_experts);

// open_cache_experts + create_cache. Nullptr, with the reason in *why_not,
// when the cache cannot be created for this budget/pack (e.g. fewer slots
// than top-k); pack errors throw.
std::unique_ptr<ExpertSource> make_cache_experts(const PackSourceOptions& opts, int n_expected_experts,
                                                 std::string* why_not);

// Experts sliced out of the 3-D ffn_*_exps tensors of a plain GGUF. Nullptr
// when the GGUF has no routed-expert tensors at all.
std::unique_ptr<ExpertSource> make_gguf_experts(const Weights& w);

// A host-memory source (the plain GGUF's) seen from a device backend: each
// (layer, expert) is uploaded with be.upload on first use and kept for the
// source's life (experts_upload.cpp).
std::unique_ptr<ExpertSource> make_uploaded_experts(std::unique_ptr<ExpertSource> host, Backend& be);

}  // namespace xrun
