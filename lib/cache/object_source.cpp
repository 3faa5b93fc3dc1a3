#include "cache/object_source.h"

#include "common/checked_math.h"
#include "pack/pack_reader.h"

namespace xpack::cache {

ObjectSource object_source_from_pack(std::shared_ptr<const pack::PackReader> reader) {
  ObjectSource s;
  s.path = reader->path();
  s.n_layers = reader->n_layers();
  s.n_experts = reader->n_experts();
  s.top_k = reader->n_experts_used();
  s.object_bytes = reader->object_bytes();
  s.read_bytes = align_up(reader->object_bytes(), 4096);
  s.offset = [reader](uint32_t l, uint32_t e) { return reader->object_offset(l, e); };
  s.checksum = [reader](uint32_t l, uint32_t e) { return reader->object_checksum(l, e); };
  return s;
}

}  // namespace xpack::cache
