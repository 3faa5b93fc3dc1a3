// Read side of an Expert Pack for C++ callers (the I/O engine, the cache, the C API).
//
// open() checks everything cheap (magic, version, both header checksums, limits,
// alignment of data_start and stride, role placement, file size) and fails closed.
// After open the object is read-only: every accessor is thread-safe, and reads use
// pread on the buffered fd. The I/O engine opens its own O_DIRECT fd on path().
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "pack/format.h"

namespace xpack::pack {

struct OpenOptions {
  // If non-empty: the trunk GGUF written by xpack-build, or the original source
  // GGUF (any shard); open fails with XPACK_E_IDENTITY unless it belongs to the pack.
  std::string trunk_path;
};

enum class ValidateLevel { kStructure = 0, kChecksums = 1 };

// Where validation found damage: role is -1 when the object checksum fails but no
// single role's does (damage between roles).
struct Fault {
  uint32_t layer_slot = 0;
  uint32_t block = 0;  // GGUF block index of layer_slot
  uint32_t expert = 0;
  int32_t role = -1;     // -1: between roles, or in the padding
  bool padding = false;  // the bytes after the payload are not zero
};

class PackReader {
 public:
  static Result<PackReader> open(const std::string& path, const OpenOptions& opts = {});

  PackReader() = default;
  PackReader(PackReader&&) noexcept;
  PackReader& operator=(PackReader&&) noexcept;
  PackReader(const PackReader&) = delete;
  PackReader& operator=(const PackReader&) = delete;
  ~PackReader();

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }  // O_RDONLY (buffered), owned by the reader
  const Index& index() const { return idx_; }

  uint32_t version() const { return idx_.version; }
  const std::string& arch() const { return idx_.arch; }
  uint32_t n_layers() const { return idx_.n_layers(); }
  uint32_t n_experts() const { return idx_.n_experts; }
  uint32_t n_experts_used() const { return idx_.n_experts_used; }
  uint32_t alignment() const { return idx_.alignment; }
  uint64_t data_start() const { return idx_.data_start; }
  uint64_t object_stride() const { return idx_.object_stride; }
  uint64_t object_bytes() const { return idx_.object_bytes; }
  uint64_t file_size() const { return idx_.file_size; }
  uint64_t n_objects() const { return idx_.n_objects(); }
  const std::array<uint8_t, 32>& source_identity() const { return idx_.source_identity; }
  std::string source_identity_hex() const;
  const std::vector<ShardIdentity>& shards() const { return idx_.shards; }

  const std::vector<uint32_t>& layer_blocks() const { return idx_.layer_blocks; }
  // Object-table row of a GGUF block, or nullopt for a dense / absent layer.
  std::optional<uint32_t> layer_slot(uint32_t block) const;

  const std::vector<Role>& roles() const { return idx_.roles; }
  // Role index by name, or -1.
  int find_role(const std::string& name) const;

  bool valid_object(uint32_t layer_slot, uint32_t expert) const {
    return layer_slot < n_layers() && expert < n_experts();
  }
  // data_start + (layer_slot * n_experts + expert) * stride. The caller checks
  // valid_object(); the result is 4096-aligned.
  uint64_t object_offset(uint32_t layer_slot, uint32_t expert) const {
    return idx_.data_start + (uint64_t(layer_slot) * idx_.n_experts + expert) * idx_.object_stride;
  }
  // Stored xxh3-64 of the object's payload (object_bytes) / of one role's bytes.
  uint64_t object_checksum(uint32_t layer_slot, uint32_t expert) const;
  uint64_t role_checksum(uint32_t layer_slot, uint32_t expert, uint32_t role) const;

  // Reads one object's payload (object_bytes) with pread; checks its checksum when
  // `verify` (XPACK_E_OBJECT_CHECKSUM on mismatch). buf_size must be >= object_bytes.
  Status read_object(uint32_t layer_slot, uint32_t expert, void* buf, size_t buf_size,
                     bool verify) const;

  // kStructure: re-checks the index (as open does). kChecksums: also every object and
  // role checksum; on the first bad object returns XPACK_E_OBJECT_CHECKSUM and fills
  // *fault (may be null); with a trunk given at open, then every trunk tensor
  // (verify_trunk: XPACK_E_CHECKSUM names it). `progress(done, total)` may be null.
  Status validate(ValidateLevel level, Fault* fault = nullptr,
                  void (*progress)(uint64_t done, uint64_t total, void* ctx) = nullptr,
                  void* ctx = nullptr) const;

 private:
  std::string path_;
  std::string trunk_path_;  // OpenOptions::trunk_path: validate() checks its tensors too
  int fd_ = -1;
  Index idx_;
};

// Checks that the GGUF at `gguf_path` is the pack's trunk (xpack.source_identity
// matches) or one of its source shards (metadata SHA-256 and sizes match).
Status check_identity(const Index& idx, const std::string& gguf_path);

}  // namespace xpack::pack
