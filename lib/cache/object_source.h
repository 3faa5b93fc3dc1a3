// What the cache needs to know about the objects it loads: one file, a grid of
// (layer, expert) objects of equal size, where each starts and its checksum.
// Decoupled from the pack reader so the cache can be tested on any file and the
// pack format can evolve without touching the cache. The C API builds one from a
// pack through the pack's public accessors (lib/capi/cache_api.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/result.h"

namespace xpack::cache {

struct ObjectSource {
  std::string path;
  uint32_t n_layers = 0;   // object-table rows (the pack's layer_slot): the cache's "layer"
  uint32_t n_experts = 0;
  uint32_t top_k = 0;      // experts per token and layer; 0 if unknown
  uint64_t object_bytes = 0;
  // Bytes read per object: object_bytes rounded up to 4096 (never beyond the stride).
  uint64_t read_bytes = 0;
  // File offset of (layer, expert), 4096-aligned.
  std::function<uint64_t(uint32_t layer, uint32_t expert)> offset;
  // xxh3-64 of the object's object_bytes payload (used when verification is on).
  std::function<uint64_t(uint32_t layer, uint32_t expert)> checksum;
};

}  // namespace xpack::cache
