// Expert Pack format v1: the on-disk structures (doc/pack-format.md is the byte-by-byte
// specification; this file and format.cpp must agree with it).
//
// File = [header 256 B][layer table][role table][shard table][checksum table]
//        [zero padding to data_start][objects ...]
// Everything before data_start is "header + index"; the header carries an xxh3-64 of
// its own first 248 bytes and one of the index bytes [256, data_start), so a damaged
// byte anywhere there is caught at open.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace xpack::pack {

inline constexpr char kMagic[8] = {'X', 'P', 'A', 'C', 'K', '-', 'E', 'P'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kHeaderBytes = 256;
inline constexpr uint32_t kRoleEntryBytes = 256;
inline constexpr uint32_t kShardEntryBytes = 64;
inline constexpr uint32_t kAlignment = 4096;
// Role offsets inside an object are multiples of this, so device kernels can use
// vector loads at the start of every role.
inline constexpr uint32_t kRoleAlignment = 64;
inline constexpr uint32_t kChecksumXxh3_64 = 1;

// Sanity limits against hostile headers. Real models: Kimi-K3 has 92 x 896 objects.
inline constexpr uint32_t kMaxLayers = 4096;
inline constexpr uint32_t kMaxExperts = 1u << 16;
inline constexpr uint64_t kMaxObjects = 1ull << 22;
inline constexpr uint32_t kMaxRoles = 8;
inline constexpr uint32_t kMaxShards = 10000;
inline constexpr uint64_t kMaxDataStart = 1ull << 30;
inline constexpr size_t kRoleNameBytes = 16;
inline constexpr size_t kSourcePatternBytes = 96;
inline constexpr size_t kArchBytes = 64;
// The token a role's source pattern holds in place of the GGUF block index.
inline constexpr const char* kBlockToken = "{block}";

// One per-expert tensor kind stored in every object ("gate", "up", "down", "gate_up").
struct Role {
  std::string name;
  uint32_t type = 0;                     // ggml type id
  uint32_t n_dims = 0;                   // dims of one expert's slice (expert dim removed)
  std::array<uint64_t, 3> ne{1, 1, 1};
  uint64_t offset = 0;                   // inside every object
  uint64_t nbytes = 0;
  std::string source_pattern;            // "blk.{block}.ffn_up_exps.weight"
  uint32_t source_n_dims = 0;            // dims of the whole source tensor
  std::array<uint64_t, 4> source_ne{1, 1, 1, 1};

  // The GGUF tensor this role comes from in block `block`.
  std::string source_name(uint32_t block) const;
};

// Identity of one source GGUF file (one shard of a split set).
struct ShardIdentity {
  std::array<uint8_t, 32> metadata_sha256{};  // SHA-256 of bytes [0, metadata_bytes)
  uint64_t metadata_bytes = 0;                // the GGUF data offset
  uint64_t file_size = 0;
  uint64_t tensor_count = 0;
};

// Everything before data_start, decoded.
struct Index {
  uint32_t version = kVersion;
  uint32_t alignment = kAlignment;
  uint32_t n_experts = 0;
  uint32_t n_experts_used = 0;  // top-k, 0 if unknown
  uint32_t flags = 0;
  uint64_t file_size = 0;
  uint64_t data_start = 0;
  uint64_t object_stride = 0;
  uint64_t object_bytes = 0;
  std::string arch;
  std::array<uint8_t, 32> source_identity{};
  std::vector<uint32_t> layer_blocks;   // GGUF block index of each object-table row
  std::vector<Role> roles;              // in object order
  std::vector<ShardIdentity> shards;
  // Per object (row-major: slot * n_experts + expert): [object xxh3, role 0 xxh3, ...].
  std::vector<uint64_t> checksums;

  uint32_t n_layers() const { return static_cast<uint32_t>(layer_blocks.size()); }
  uint32_t n_roles() const { return static_cast<uint32_t>(roles.size()); }
  uint64_t n_objects() const { return uint64_t(layer_blocks.size()) * n_experts; }
  size_t checksum_row(uint64_t object) const { return object * (1 + roles.size()); }
};

// Byte layout of the index for given counts (all offsets absolute).
struct IndexLayout {
  uint64_t layer_table = 0;
  uint64_t role_table = 0;
  uint64_t shard_table = 0;
  uint64_t checksum_table = 0;
  uint64_t index_end = 0;   // first byte after the checksum table
  uint64_t data_start = 0;  // index_end rounded up to kAlignment
};
// Fails with XPACK_E_LIMIT when a count is beyond the limits above.
Result<IndexLayout> index_layout(uint64_t n_layers, uint64_t n_experts, uint64_t n_roles,
                                 uint64_t n_shards);

// Places roles in object order at kRoleAlignment offsets and returns the object's
// payload bytes (end of the last role); sets each role's offset.
uint64_t place_roles(std::vector<Role>& roles);

// Encodes header + index (+ zero padding) into exactly data_start bytes, computing
// both header checksums. The caller fills data_start/file_size/stride/... first.
Result<std::vector<uint8_t>> encode_index(const Index& idx);

// The file position of an object's checksum row (used by the builder, which
// writes rows as objects complete and the header checksums at the end).
uint64_t checksum_row_offset(const IndexLayout& layout, uint64_t object, uint32_t n_roles);

// Decodes and checks the bytes [0, data_start) of a pack whose real size is
// `actual_file_size`. Errors: XPACK_E_TRUNCATED, BAD_MAGIC, VERSION, CHECKSUM,
// LIMIT, FORMAT, MISALIGNED, SIZE_MISMATCH, UNKNOWN_TYPE.
//
// Reads through `read_at(offset, n) -> Result<vector>` so the caller controls I/O;
// nothing larger than min(actual_file_size, kMaxDataStart) is ever allocated.
struct IndexSource {
  virtual ~IndexSource() = default;
  virtual Status read(uint64_t off, void* dst, size_t n) = 0;
};
// `check_index_checksum` = false is only for the builder resuming its own partial
// file, whose checksum rows are being filled in.
Result<Index> decode_index(IndexSource& src, uint64_t actual_file_size, const std::string& name,
                           bool check_index_checksum = true);

// xxh3-64: the pack's checksums, and the cache's check of every object it reads
// (on the CPU's widest SIMD where xxHash can dispatch; the same hash either way).
uint64_t xxh3(const void* data, size_t n);

}  // namespace xpack::pack
