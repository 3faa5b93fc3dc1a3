// GGUF v2/v3 reader: parses the header, metadata and tensor infos of one file
// and validates them against hostile input (bounded allocations, overflow-checked
// sizes, in-file ranges, alignment, overlaps, duplicates).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace xpack::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12
};
const char* value_type_name(ValueType t);

// Size in bytes of a scalar value type in the file (0 for STRING and ARRAY).
size_t scalar_size(ValueType t);

struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;      // U8/U16/U32/U64/BOOL (and I* bit patterns, sign-extended to 64)
  double f = 0;        // F32/F64
  std::string str;     // STRING
  ValueType elem_type = ValueType::U8;  // ARRAY

  // ARRAY storage. A hostile file must not be able to make us allocate much more
  // than its own size, so elements are not Values: scalars keep their little-endian
  // file bytes in `raw`; strings keep their bytes in `raw`, each followed by a NUL
  // (so C callers get terminated strings), with `ends[i]` the offset of element i's
  // NUL; only nested arrays are Values (`nested`).
  uint64_t count = 0;
  std::string raw;
  std::vector<uint64_t> ends;
  std::vector<Value> nested;

  bool is_int() const;                  // any integer type or BOOL
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
  int64_t as_i64() const { return static_cast<int64_t>(u); }

  uint64_t array_size() const { return count; }
  // Element i of an ARRAY, decoded (strings and nested arrays are copied).
  Value element(uint64_t i) const;
  // Element i of a STRING array, pointing into `raw` (NUL-terminated there).
  std::string_view string_element(uint64_t i) const;
  // Builds an ARRAY from decoded elements (each must have type elem_type).
  static Result<Value> make_array(ValueType elem_type, const std::vector<Value>& elems);
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};
  uint32_t type = 0;
  uint64_t offset = 0;       // relative to the data section, as stored
  uint64_t file_offset = 0;  // absolute: data_offset + offset
  uint64_t nbytes = 0;
  uint32_t shard = 0;        // set by Model for split sets
};

// Something a GGUF can be parsed from: a file (pread) or a memory buffer (fuzzing).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly n bytes at off (caller guarantees off+n <= size()).
  virtual Status read(uint64_t off, void* dst, size_t n) = 0;
};

class File {
 public:
  // Parses and validates a GGUF file. The file stays open (fd) for data reads.
  static Result<File> open(const std::string& path);
  // Same checks on any byte source (used by the fuzzer and tests).
  static Result<File> parse(ByteSource& src, std::string name);

  File() = default;
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }   // start of tensor data
  uint64_t file_size() const { return file_size_; }
  int fd() const { return fd_; }

  const std::vector<KeyValue>& kvs() const { return kvs_; }
  const Value* find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters with clear errors (missing key, wrong type).
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::vector<KeyValue> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Limits against hostile files: nothing bigger is ever allocated.
inline constexpr uint64_t kMaxStringBytes = 1ull << 24;   // 16 MiB per string
inline constexpr uint64_t kMaxKeyBytes = 65535;
inline constexpr uint64_t kMaxTensorNameBytes = 1024;      // spec says 64; be lenient
inline constexpr uint64_t kMaxTensors = 1ull << 20;
inline constexpr uint64_t kMaxKvs = 1ull << 20;
inline constexpr uint32_t kMaxArrayDepth = 8;

}  // namespace xpack::gguf
