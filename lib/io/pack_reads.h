// Binds the generic read engine to an Expert Pack: object (layer_slot, expert)
// -> one aligned read of its payload into a slot. Only the geometry of the pack
// is needed, so the same code serves the C++ PackReader and the C API handle.
#pragma once
#include <cstdint>
#include <string>

#include "common/result.h"
#include "io/read_engine.h"

namespace xpack::pack {
class PackReader;
}

namespace xpack::io {

struct PackGeometry {
  std::string path;
  uint64_t data_start = 0;
  uint64_t object_stride = 0;
  uint64_t object_bytes = 0;  // payload; may be unaligned
  uint32_t n_layers = 0;
  uint32_t n_experts = 0;
};

PackGeometry geometry_of(const pack::PackReader& p);

// Checks what the engine relies on: aligned data_start and stride, payload that
// fits the stride, no overflow. XPACK_E_MISALIGNED / XPACK_E_FORMAT otherwise.
Status check_geometry(const PackGeometry& g);

// Bytes read per object: the payload rounded up to 4096 (O_DIRECT needs aligned
// lengths; the stride padding makes the extra bytes exist). The slot size.
uint64_t object_read_length(const PackGeometry& g);

// Tags carry (layer_slot, expert) through the engine.
inline uint64_t object_tag(uint32_t layer_slot, uint32_t expert) {
  return (uint64_t(layer_slot) << 32) | expert;
}
inline uint32_t tag_layer_slot(uint64_t tag) { return static_cast<uint32_t>(tag >> 32); }
inline uint32_t tag_expert(uint64_t tag) { return static_cast<uint32_t>(tag); }

// The read of object (layer_slot, expert) into `slot`; XPACK_E_INVALID_ARG when the
// object does not exist.
Result<ReadRequest> object_read(const PackGeometry& g, uint32_t layer_slot, uint32_t expert,
                                uint32_t slot);

// An engine configuration for the pack with the given knobs (paths, slot size).
EngineConfig engine_config_for(const PackGeometry& g, uint32_t slots, uint32_t queue_depth,
                               uint32_t read_splits);

}  // namespace xpack::io
