#include "gguf/ggml_type.h"

#include <cstring>

#include "common/checked_math.h"

namespace xpack::gguf {

namespace {
// Sizes from ggml-common.h's block structs (see doc/pack-format.md §types).
constexpr TypeInfo kTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},      {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},    {6, "Q5_0", 32, 22},   {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},    {9, "Q8_1", 32, 36},   {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74}, {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18}, {21, "IQ3_S", 256, 110}, {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},    {25, "I16", 1, 2},
    {26, "I32", 1, 4},      {27, "I64", 1, 8},     {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56}, {30, "BF16", 1, 2},    {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66}, {39, "MXFP4", 32, 17},
};
}  // namespace

const TypeInfo* type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

const TypeInfo* type_by_name(std::string_view name) {
  for (const auto& t : kTypes)
    if (name == t.name) return &t;
  return nullptr;
}

Result<uint64_t> tensor_nbytes(uint32_t type, const uint64_t* ne, uint32_t n_dims,
                               std::string_view what) {
  const TypeInfo* ti = type_info(type);
  if (!ti) return err(XPACK_E_UNKNOWN_TYPE, "tensor '{}': unknown ggml type id {}", what, type);
  if (n_dims == 0) return uint64_t{ti->block_bytes};  // a scalar of a 1-element type
  if (ne[0] % ti->block_elems != 0)
    return err(XPACK_E_FORMAT, "tensor '{}': ne0={} is not a multiple of the {} block size {}",
               what, ne[0], ti->name, ti->block_elems);
  uint64_t n = ne[0] / ti->block_elems;
  for (uint32_t i = 1; i < n_dims; ++i) {
    auto m = checked_mul(n, ne[i]);
    if (!m) return err(XPACK_E_LIMIT, "tensor '{}': element count overflows 64 bits", what);
    n = *m;
  }
  auto bytes = checked_mul(n, ti->block_bytes);
  if (!bytes) return err(XPACK_E_LIMIT, "tensor '{}': byte size overflows 64 bits", what);
  return *bytes;
}

}  // namespace xpack::gguf
