// JSON description of a pack's index: shared by the manifest (OUT.xpack.json) and
// `xpack-inspect --json`, so scripts can locate any expert without the C API.
#pragma once

#include <nlohmann/json.hpp>

#include "pack/format.h"

namespace xpack::pack {

// Keys: format, version, arch, file_size, data_start, alignment, object_stride,
// object_bytes, n_experts, n_experts_used, n_layers, layers, roles[{name, type,
// type_id, n_dims, ne, offset, nbytes, source_pattern, source_ne}], payload_bytes,
// padding_bytes, source_identity, source_shards[...]. Deterministic (no times).
nlohmann::ordered_json describe_index(const Index& idx);

// Payload bytes (roles) and padding bytes (everything else) of the whole file.
uint64_t payload_bytes(const Index& idx);

}  // namespace xpack::pack
