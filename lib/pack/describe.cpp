#include "pack/describe.h"

#include "gguf/ggml_type.h"
#include "pack/identity.h"

namespace xpack::pack {

uint64_t payload_bytes(const Index& idx) {
  uint64_t per_object = 0;
  for (const Role& r : idx.roles) per_object += r.nbytes;
  return per_object * idx.n_objects();
}

nlohmann::ordered_json describe_index(const Index& idx) {
  using json = nlohmann::ordered_json;
  json j;
  j["format"] = "xpack-expert-pack";
  j["version"] = idx.version;
  j["arch"] = idx.arch;
  j["file_size"] = idx.file_size;
  j["data_start"] = idx.data_start;
  j["alignment"] = idx.alignment;
  j["object_stride"] = idx.object_stride;
  j["object_bytes"] = idx.object_bytes;
  j["n_experts"] = idx.n_experts;
  j["n_experts_used"] = idx.n_experts_used;
  j["n_layers"] = idx.n_layers();
  j["n_objects"] = idx.n_objects();
  j["layers"] = idx.layer_blocks;
  json roles = json::array();
  for (const Role& r : idx.roles) {
    const gguf::TypeInfo* ti = gguf::type_info(r.type);
    json jr;
    jr["name"] = r.name;
    jr["type"] = ti ? ti->name : "?";
    jr["type_id"] = r.type;
    jr["n_dims"] = r.n_dims;
    jr["ne"] = std::vector<uint64_t>(r.ne.begin(), r.ne.begin() + r.n_dims);
    jr["offset"] = r.offset;
    jr["nbytes"] = r.nbytes;
    jr["source_pattern"] = r.source_pattern;
    jr["source_ne"] = std::vector<uint64_t>(r.source_ne.begin(), r.source_ne.begin() + r.source_n_dims);
    roles.push_back(std::move(jr));
  }
  j["roles"] = std::move(roles);
  uint64_t payload = payload_bytes(idx);
  j["payload_bytes"] = payload;
  j["padding_bytes"] = idx.file_size - idx.data_start - payload;
  j["offset_formula"] = "data_start + (layer_slot * n_experts + expert) * object_stride + role.offset";
  j["checksum"] = "xxh3-64";
  j["source_identity"] = to_hex(idx.source_identity);
  json shards = json::array();
  for (const ShardIdentity& s : idx.shards) {
    json js;
    js["metadata_sha256"] = to_hex(s.metadata_sha256);
    js["metadata_bytes"] = s.metadata_bytes;
    js["file_size"] = s.file_size;
    js["tensor_count"] = s.tensor_count;
    shards.push_back(std::move(js));
  }
  j["source_shards"] = std::move(shards);
  return j;
}

}  // namespace xpack::pack
