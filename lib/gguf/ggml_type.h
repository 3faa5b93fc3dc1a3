// The ggml tensor type table: id, name, elements per block, bytes per block.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "common/result.h"

namespace xpack::gguf {

struct TypeInfo {
  uint32_t id;
  const char* name;
  uint32_t block_elems;
  uint32_t block_bytes;
};

// nullptr for ids not in the table (including removed ids 4, 5, 31-33, 36-38).
const TypeInfo* type_info(uint32_t id);
// Case-sensitive ggml name ("Q2_K", "MXFP4", "F32").
const TypeInfo* type_by_name(std::string_view name);

// Bytes of a tensor with these dims, checking ne0 % block_elems and overflow.
// `what` names the tensor in the error message.
Result<uint64_t> tensor_nbytes(uint32_t type, const uint64_t* ne, uint32_t n_dims,
                               std::string_view what);

}  // namespace xpack::gguf
