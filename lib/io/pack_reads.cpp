#include "io/pack_reads.h"

#include "common/checked_math.h"
#include "io/alignment.h"
#include "pack/pack_reader.h"

namespace xpack::io {

PackGeometry geometry_of(const pack::PackReader& p) {
  PackGeometry g;
  g.path = p.path();
  g.data_start = p.data_start();
  g.object_stride = p.object_stride();
  g.object_bytes = p.object_bytes();
  g.n_layers = p.n_layers();
  g.n_experts = p.n_experts();
  return g;
}

Status check_geometry(const PackGeometry& g) {
  if (g.object_bytes == 0 || g.n_layers == 0 || g.n_experts == 0)
    return err(XPACK_E_FORMAT, "pack {} has no objects to read", g.path);
  if (!io_aligned(g.data_start) || !io_aligned(g.object_stride))
    return err(XPACK_E_MISALIGNED, "pack {}: data_start {} and stride {} must be multiples of {}",
               g.path, g.data_start, g.object_stride, kDirectIoAlign);
  if (align_up(g.object_bytes, kDirectIoAlign) > g.object_stride)
    return err(XPACK_E_FORMAT, "pack {}: object payload {} exceeds the stride {}", g.path,
               g.object_bytes, g.object_stride);
  auto n = checked_mul(uint64_t(g.n_layers), g.n_experts);
  auto span = n ? checked_mul(*n, g.object_stride) : std::nullopt;
  if (!span || !checked_add(*span, g.data_start))
    return err(XPACK_E_LIMIT, "pack {}: object table size overflows", g.path);
  return {};
}

uint64_t object_read_length(const PackGeometry& g) {
  return align_up(g.object_bytes, kDirectIoAlign);
}

Result<ReadRequest> object_read(const PackGeometry& g, uint32_t layer_slot, uint32_t expert,
                                uint32_t slot) {
  if (layer_slot >= g.n_layers || expert >= g.n_experts)
    return err(XPACK_E_INVALID_ARG, "object (layer slot {}, expert {}) not in pack ({} x {})",
               layer_slot, expert, g.n_layers, g.n_experts);
  ReadRequest r;
  r.file = 0;
  r.offset = g.data_start + (uint64_t(layer_slot) * g.n_experts + expert) * g.object_stride;
  r.length = object_read_length(g);
  r.slot = slot;
  r.tag = object_tag(layer_slot, expert);
  return r;
}

EngineConfig engine_config_for(const PackGeometry& g, uint32_t slots, uint32_t queue_depth,
                               uint32_t read_splits) {
  EngineConfig c;
  c.paths = {g.path};
  c.slot_count = slots;
  c.slot_bytes = object_read_length(g);
  c.queue_depth = queue_depth;
  c.read_splits = read_splits;
  return c;
}

}  // namespace xpack::io
