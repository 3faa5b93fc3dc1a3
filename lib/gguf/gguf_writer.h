// GGUF v3 writer: lays out metadata, tensor infos and aligned tensor offsets, so
// tests, xpack-synth and the trunk writer produce files the reader accepts.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "gguf/gguf_file.h"

namespace xpack::gguf {

// Builders for metadata values (integers keep their bit pattern sign-extended
// to 64 bits, as the reader stores them).
namespace val {
Value u8(uint8_t v);
Value i8(int8_t v);
Value u16(uint16_t v);
Value i16(int16_t v);
Value u32(uint32_t v);
Value i32(int32_t v);
Value u64(uint64_t v);
Value i64(int64_t v);
Value f32(float v);
Value f64(double v);
Value boolean(bool v);
Value str(std::string v);
// Every element must have type `elem_type` (checked when the header is encoded).
Value array(ValueType elem_type, std::vector<Value> elems);
Value u32_array(const std::vector<uint32_t>& v);
Value u64_array(const std::vector<uint64_t>& v);
Value i32_array(const std::vector<int32_t>& v);
Value f32_array(const std::vector<float>& v);
Value str_array(const std::vector<std::string>& v);
}  // namespace val

// Little-endian encoders for the GGUF wire format. Exposed so tests can build
// deliberately malformed files byte by byte.
namespace wire {
void put_u8(std::vector<uint8_t>& out, uint8_t v);
void put_u16(std::vector<uint8_t>& out, uint16_t v);
void put_u32(std::vector<uint8_t>& out, uint32_t v);
void put_u64(std::vector<uint8_t>& out, uint64_t v);
void put_string(std::vector<uint8_t>& out, std::string_view s);
// The value's payload only (no type tag). Fails on an array whose elements do not
// match its elem_type, a BOOL other than 0/1, or nesting deeper than kMaxArrayDepth.
Status put_value(std::vector<uint8_t>& out, const Value& v);
}  // namespace wire

// Not thread-safe: even the const accessors fill an internal cache.
class Writer {
 public:
  // `alignment` lays out the data section. general.alignment is written only if
  // the caller adds it as a kv (it must then equal `alignment`).
  explicit Writer(uint32_t alignment = 32);

  void add_kv(KeyValue kv);  // keeps order
  void add_kv(std::string key, Value v) { add_kv(KeyValue{std::move(key), std::move(v)}); }
  // Replaces the value of an added key (XPACK_E_NOT_FOUND if absent), e.g. a value
  // known only once the data is written; the header grows only if its size does.
  Status set_kv(const std::string& key, Value v);
  // Offsets are assigned in call order, each aligned to `alignment`.
  void add_tensor(std::string name, uint32_t type, std::vector<uint64_t> ne);

  // magic, v3, counts, kvs, tensor infos, zero padding up to data_offset(). Fails
  // on duplicate names/keys, unknown types, bad shapes, bad alignment.
  Result<std::vector<uint8_t>> header_bytes() const;

  uint32_t alignment() const { return alignment_; }
  size_t tensor_count() const { return tensors_.size(); }
  const std::string& tensor_name(size_t i) const { return tensors_[i].name; }
  uint64_t data_offset() const;              // absolute start of the data section
  uint64_t tensor_offset(size_t i) const;    // relative to data_offset()
  uint64_t tensor_nbytes(size_t i) const;    // 0 for a tensor with an invalid shape/type
  uint64_t total_size() const;               // data_offset + last tensor end, padded

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;   // 0 when the shape or type is invalid (reported by header_bytes)
    uint64_t offset;   // relative
  };
  Status validate() const;
  uint64_t header_size() const;

  uint32_t alignment_;
  // header_size() walks every value (a vocab can hold 10^5 strings): cache it
  // between additions, since callers ask for offsets once per tensor.
  mutable uint64_t header_size_cache_ = 0;
  mutable bool header_size_valid_ = false;
  std::vector<KeyValue> kvs_;
  std::vector<Tensor> tensors_;
  uint64_t data_end_ = 0;  // relative end of the last tensor, unpadded
};

// Fills `dst` (n bytes) with the data of tensor i.
using TensorFiller = std::function<Status(size_t i, uint8_t* dst, size_t n)>;

// Writes a complete GGUF: header, then every tensor at its offset, zero gaps,
// zero padding to total_size(). Writes PATH.tmp and renames it over PATH.
Status write_gguf(const std::string& path, const Writer& w, const TensorFiller& fill);
// In-memory variant: data[i].size() must equal w.tensor_nbytes(i).
Status write_gguf(const std::string& path, const Writer& w,
                  const std::vector<std::vector<uint8_t>>& data);
// The whole file as bytes (small files: tests, fuzz seeds).
Result<std::vector<uint8_t>> gguf_bytes(const Writer& w,
                                        const std::vector<std::vector<uint8_t>>& data);

}  // namespace xpack::gguf
