// Helpers for the GGUF suites: an in-memory ByteSource, a raw byte-level GGUF
// builder for malformed files, value comparison, and small valid files.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace xpack::test {

class MemorySource : public gguf::ByteSource {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  MemorySource(const std::vector<uint8_t>& bytes, size_t n)
      : bytes_(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status read(uint64_t off, void* dst, size_t n) override {
    if (off > bytes_.size() || n > bytes_.size() - off)
      return err(XPACK_E_INTERNAL, "MemorySource: read past end ({} + {} > {})", off, n,
                 bytes_.size());
    std::memcpy(dst, bytes_.data() + off, n);
    return {};
  }

 private:
  std::vector<uint8_t> bytes_;
};

inline Result<gguf::File> parse_bytes(const std::vector<uint8_t>& bytes) {
  MemorySource src(bytes);
  return gguf::File::parse(src, "mem.gguf");
}

// Builds a GGUF byte by byte so every field can be made wrong on purpose.
class RawGguf {
 public:
  RawGguf(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3, uint32_t magic = 0x46554747u) {
    gguf::wire::put_u32(b, magic);
    gguf::wire::put_u32(b, version);
    gguf::wire::put_u64(b, n_tensors);
    gguf::wire::put_u64(b, n_kv);
  }
  RawGguf& kv(const std::string& key, const gguf::Value& v) {
    gguf::wire::put_string(b, key);
    gguf::wire::put_u32(b, static_cast<uint32_t>(v.type));
    (void)gguf::wire::put_value(b, v);
    return *this;
  }
  // A kv whose value bytes are given raw (after the type tag).
  RawGguf& kv_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& payload) {
    gguf::wire::put_string(b, key);
    gguf::wire::put_u32(b, type);
    b.insert(b.end(), payload.begin(), payload.end());
    return *this;
  }
  RawGguf& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  uint64_t offset) {
    gguf::wire::put_string(b, name);
    gguf::wire::put_u32(b, static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) gguf::wire::put_u64(b, d);
    gguf::wire::put_u32(b, type);
    gguf::wire::put_u64(b, offset);
    return *this;
  }
  // Zero padding to `alignment`, then `data_bytes` bytes of data (pattern 0xAB).
  RawGguf& data(uint64_t alignment, uint64_t data_bytes) {
    while (b.size() % alignment) b.push_back(0);
    b.insert(b.end(), data_bytes, 0xAB);
    return *this;
  }
  std::vector<uint8_t> b;
};

// Bitwise equality of metadata values (floats compared by bits: NaN == NaN).
inline bool same_value(const gguf::Value& a, const gguf::Value& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case gguf::ValueType::F32: {
      float x = static_cast<float>(a.f), y = static_cast<float>(b.f);
      return std::memcmp(&x, &y, 4) == 0;
    }
    case gguf::ValueType::F64: return std::memcmp(&a.f, &b.f, 8) == 0;
    case gguf::ValueType::STRING: return a.str == b.str;
    case gguf::ValueType::ARRAY:
      if (a.elem_type != b.elem_type || a.array_size() != b.array_size()) return false;
      for (size_t i = 0; i < a.array_size(); ++i)
        if (!same_value(a.element(i), b.element(i))) return false;
      return true;
    default: return a.u == b.u;
  }
}

// Deterministic test bytes for tensor i.
inline std::vector<uint8_t> pattern_bytes(size_t i, uint64_t n) {
  std::vector<uint8_t> v(n);
  uint32_t x = 0x9E3779B9u * static_cast<uint32_t>(i + 1);
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// A small valid GGUF (a few kvs, three tensors of different types) as bytes.
inline std::vector<uint8_t> small_gguf(uint32_t alignment = 32) {
  gguf::Writer w(alignment);
  w.add_kv("general.architecture", gguf::val::str("llama"));
  if (alignment != 32) w.add_kv("general.alignment", gguf::val::u32(alignment));
  w.add_kv("llama.block_count", gguf::val::u32(1));
  w.add_kv("tokenizer.ggml.tokens", gguf::val::str_array({"a", "bc", ""}));
  w.add_tensor("token_embd.weight", 0, {8, 3});
  w.add_tensor("blk.0.ffn_up_exps.weight", 10, {256, 2, 2});
  w.add_tensor("output_norm.weight", 1, {8});
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < w.tensor_count(); ++i) data.push_back(pattern_bytes(i, w.tensor_nbytes(i)));
  auto r = gguf::gguf_bytes(w, data);
  return r.ok() ? r.value() : std::vector<uint8_t>{};
}

}  // namespace xpack::test
