// Source identity: which GGUF a pack (and its trunk) was built from. Each source
// shard is identified by the SHA-256 of its metadata section [0, data_offset) plus
// its sizes; the pack's identity digest combines all shards (doc/pack-format.md).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "pack/format.h"

namespace xpack::pack {

// Metadata keys the trunk GGUF carries to tie it to its pack.
inline constexpr const char* kTrunkIdentityKey = "xpack.source_identity";     // hex string
inline constexpr const char* kTrunkFormatKey = "xpack.pack_format_version";   // u32
// u64 array, one per trunk tensor in tensor-info order: xxh3-64 of its bytes.
inline constexpr const char* kTrunkChecksumsKey = "xpack.tensor_xxh3";

using Sha256 = std::array<uint8_t, 32>;

// SHA-256 of bytes [0, n) of an open file (read with pread in bounded chunks).
Result<Sha256> sha256_file_prefix(int fd, uint64_t n, const std::string& name);
Sha256 sha256_bytes(const void* data, size_t n);

// Identity of a GGUF file: metadata hash over [0, data_offset), sizes, tensor count.
Result<ShardIdentity> shard_identity(int fd, uint64_t data_offset, uint64_t file_size,
                                     uint64_t tensor_count, const std::string& name);

// SHA-256("xpack-source-identity-v1" || for each shard: sha256 || le64 metadata_bytes
// || le64 file_size || le64 tensor_count).
Sha256 combine_identity(const std::vector<ShardIdentity>& shards);

std::string to_hex(const uint8_t* p, size_t n);
template <size_t N>
std::string to_hex(const std::array<uint8_t, N>& a) { return to_hex(a.data(), N); }

}  // namespace xpack::pack
