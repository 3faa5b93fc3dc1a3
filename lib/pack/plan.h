// Planning a pack from a source GGUF: which tensors are routed experts, the role
// table, the layer table, sizes, and where each (layer, role) comes from.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "gguf/gguf_file.h"
#include "pack/format.h"

namespace xpack::pack {

// A routed-expert tensor name: blk.N.ffn_{gate,up,down,gate_up}_exps.weight.
struct ExpertTensorName {
  uint32_t block = 0;
  std::string role;  // "gate", "up", "down", "gate_up"
};
std::optional<ExpertTensorName> parse_expert_tensor_name(std::string_view name);

// Where the bytes of one source tensor live.
struct SourceRef {
  uint32_t shard = 0;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
};

struct Plan {
  Index index;          // everything but checksums (zero-filled)
  IndexLayout layout;
  std::vector<SourceRef> expert_sources;     // [slot * n_roles + role]
  std::vector<gguf::TensorInfo> trunk_tensors;  // in source order (.shard set)
  // Objects that must be durably written before shard s can be deleted
  // (0 if the shard holds no routed experts).
  std::vector<uint64_t> shard_needed_until;
};

// Builds the plan from the shards of a model (shard 0 holds the metadata).
// Computes each shard's identity (SHA-256 of its metadata section).
// Errors: no routed experts (XPACK_E_NOT_FOUND), layers disagreeing on roles, types
// or shapes (XPACK_E_UNSUPPORTED), inconsistent expert counts (XPACK_E_FORMAT).
Result<Plan> make_plan(const std::vector<const gguf::File*>& shards);

// Finds the source of every (layer, role) of an existing index in the shards that
// are still present (nullptr = consumed); rows whose shard is gone get nullopt.
// Checks type, shape and size of every tensor found.
Result<std::vector<std::optional<SourceRef>>> locate_sources(
    const Index& index, const std::vector<const gguf::File*>& shards);

}  // namespace xpack::pack
