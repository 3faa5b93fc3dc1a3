#include "gguf/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include <fcntl.h>
#include <unistd.h>

#include "common/checked_math.h"
#include "gguf/ggml_type.h"

namespace xpack::gguf {

namespace val {
namespace {
Value int_value(ValueType t, uint64_t bits) {
  Value v;
  v.type = t;
  v.u = bits;
  return v;
}
}  // namespace
Value u8(uint8_t v) { return int_value(ValueType::U8, v); }
Value i8(int8_t v) { return int_value(ValueType::I8, static_cast<uint64_t>(int64_t{v})); }
Value u16(uint16_t v) { return int_value(ValueType::U16, v); }
Value i16(int16_t v) { return int_value(ValueType::I16, static_cast<uint64_t>(int64_t{v})); }
Value u32(uint32_t v) { return int_value(ValueType::U32, v); }
Value i32(int32_t v) { return int_value(ValueType::I32, static_cast<uint64_t>(int64_t{v})); }
Value u64(uint64_t v) { return int_value(ValueType::U64, v); }
Value i64(int64_t v) { return int_value(ValueType::I64, static_cast<uint64_t>(v)); }
Value boolean(bool v) { return int_value(ValueType::BOOL, v ? 1 : 0); }
Value f32(float v) {
  Value r;
  r.type = ValueType::F32;
  r.f = v;
  return r;
}
Value f64(double v) {
  Value r;
  r.type = ValueType::F64;
  r.f = v;
  return r;
}
Value str(std::string v) {
  Value r;
  r.type = ValueType::STRING;
  r.str = std::move(v);
  return r;
}
Value array(ValueType elem_type, std::vector<Value> elems) {
  auto r = Value::make_array(elem_type, elems);
  if (r.ok()) return std::move(r).value();
  // A mistyped element is a caller bug; keep a marker that header_bytes() refuses.
  Value bad;
  bad.type = ValueType::ARRAY;
  bad.elem_type = static_cast<ValueType>(0xffffffffu);
  return bad;
}
Value u32_array(const std::vector<uint32_t>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (uint32_t x : v) e.push_back(u32(x));
  return array(ValueType::U32, std::move(e));
}
Value u64_array(const std::vector<uint64_t>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (uint64_t x : v) e.push_back(u64(x));
  return array(ValueType::U64, std::move(e));
}
Value i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (int32_t x : v) e.push_back(i32(x));
  return array(ValueType::I32, std::move(e));
}
Value f32_array(const std::vector<float>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (float x : v) e.push_back(f32(x));
  return array(ValueType::F32, std::move(e));
}
Value str_array(const std::vector<std::string>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (const auto& x : v) e.push_back(str(x));
  return array(ValueType::STRING, std::move(e));
}
}  // namespace val

namespace wire {
void put_u8(std::vector<uint8_t>& out, uint8_t v) { out.push_back(v); }
void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put_u64(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

namespace {
Status put_value_at_depth(std::vector<uint8_t>& out, const Value& v, uint32_t depth) {
  switch (v.type) {
    case ValueType::U8:
    case ValueType::I8:
      put_u8(out, static_cast<uint8_t>(v.u));
      return {};
    case ValueType::U16:
    case ValueType::I16:
      put_u16(out, static_cast<uint16_t>(v.u));
      return {};
    case ValueType::U32:
    case ValueType::I32:
      put_u32(out, static_cast<uint32_t>(v.u));
      return {};
    case ValueType::U64:
    case ValueType::I64:
      put_u64(out, v.u);
      return {};
    case ValueType::BOOL:
      if (v.u > 1) return err(XPACK_E_INVALID_ARG, "bool value {} is neither 0 nor 1", v.u);
      put_u8(out, static_cast<uint8_t>(v.u));
      return {};
    case ValueType::F32: {
      float f = static_cast<float>(v.f);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      put_u32(out, bits);
      return {};
    }
    case ValueType::F64: {
      uint64_t bits;
      std::memcpy(&bits, &v.f, 8);
      put_u64(out, bits);
      return {};
    }
    case ValueType::STRING:
      put_string(out, v.str);
      return {};
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        return err(XPACK_E_LIMIT, "arrays nested deeper than {}", kMaxArrayDepth);
      if (static_cast<uint32_t>(v.elem_type) > static_cast<uint32_t>(ValueType::F64))
        return err(XPACK_E_INVALID_ARG, "array with an element of the wrong type or unknown type {}",
                   static_cast<uint32_t>(v.elem_type));
      put_u32(out, static_cast<uint32_t>(v.elem_type));
      put_u64(out, v.array_size());
      if (scalar_size(v.elem_type)) {
        if (v.elem_type == ValueType::BOOL)
          for (char b : v.raw)
            if (static_cast<uint8_t>(b) > 1)
              return err(XPACK_E_INVALID_ARG, "bool array element {} is neither 0 nor 1",
                         static_cast<uint8_t>(b));
        out.insert(out.end(), v.raw.begin(), v.raw.end());
      } else if (v.elem_type == ValueType::STRING) {
        for (uint64_t i = 0; i < v.array_size(); ++i) put_string(out, std::string(v.string_element(i)));
      } else {
        for (const Value& e : v.nested) {
          if (e.type != v.elem_type)
            return err(XPACK_E_INVALID_ARG, "nested array element has type {}",
                       static_cast<uint32_t>(e.type));
          XPACK_TRY(put_value_at_depth(out, e, depth + 1));
        }
      }
      return {};
    }
  }
  return err(XPACK_E_INVALID_ARG, "unknown value type {}", static_cast<uint32_t>(v.type));
}
}  // namespace

Status put_value(std::vector<uint8_t>& out, const Value& v) {
  return put_value_at_depth(out, v, 0);
}
}  // namespace wire

Writer::Writer(uint32_t alignment) : alignment_(alignment) {}

void Writer::add_kv(KeyValue kv) {
  kvs_.push_back(std::move(kv));
  header_size_valid_ = false;
}

Status Writer::set_kv(const std::string& key, Value v) {
  for (KeyValue& kv : kvs_) {
    if (kv.key != key) continue;
    kv.value = std::move(v);
    header_size_valid_ = false;
    return {};
  }
  return err(XPACK_E_NOT_FOUND, "GGUF writer: no key '{}' to replace", key);
}

void Writer::add_tensor(std::string name, uint32_t type, std::vector<uint64_t> ne) {
  uint64_t nbytes = 0;
  if (!ne.empty() && ne.size() <= 4) {
    bool positive = true;
    for (uint64_t d : ne) positive = positive && d > 0;
    auto r = gguf::tensor_nbytes(type, ne.data(), static_cast<uint32_t>(ne.size()), name);
    if (positive && r.ok()) nbytes = *r;
  }
  // An invalid tensor takes no space; validate() reports it before any byte is written.
  uint64_t a = alignment_ ? alignment_ : 1;
  uint64_t offset = align_up(data_end_, a);
  tensors_.push_back(Tensor{std::move(name), type, std::move(ne), nbytes, offset});
  data_end_ = offset + nbytes;
  header_size_valid_ = false;
}

Status Writer::validate() const {
  if (alignment_ == 0 || alignment_ % 8 != 0)
    return err(XPACK_E_INVALID_ARG, "alignment {} is not a positive multiple of 8", alignment_);
  std::unordered_set<std::string_view> keys;
  for (const auto& kv : kvs_) {
    if (kv.key.empty()) return err(XPACK_E_INVALID_ARG, "empty metadata key");
    if (!keys.insert(kv.key).second)
      return err(XPACK_E_DUPLICATE, "duplicate metadata key '{}'", kv.key);
    if (kv.key == "general.alignment") {
      if (kv.value.type != ValueType::U32 || kv.value.u != alignment_)
        return err(XPACK_E_INVALID_ARG,
                   "general.alignment must be a u32 equal to the writer's alignment {}",
                   alignment_);
    }
  }
  std::unordered_set<std::string_view> names;
  for (const auto& t : tensors_) {
    if (t.name.empty() || t.name.size() > kMaxTensorNameBytes)
      return err(XPACK_E_INVALID_ARG, "tensor name '{}' is empty or too long", t.name);
    if (!names.insert(t.name).second)
      return err(XPACK_E_DUPLICATE, "duplicate tensor name '{}'", t.name);
    if (t.ne.empty() || t.ne.size() > 4)
      return err(XPACK_E_INVALID_ARG, "tensor '{}': {} dims (must be 1..4)", t.name,
                 t.ne.size());
    for (uint64_t d : t.ne)
      if (d == 0) return err(XPACK_E_INVALID_ARG, "tensor '{}': a dimension is 0", t.name);
    XPACK_TRY(gguf::tensor_nbytes(t.type, t.ne.data(), static_cast<uint32_t>(t.ne.size()),
                                  t.name));
  }
  return {};
}

namespace {
// Bytes put_value writes for v (same walk, no output).
uint64_t encoded_size(const Value& v) {
  switch (v.type) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8 + v.str.size();
    case ValueType::ARRAY: {
      uint64_t n = 4 + 8;
      if (scalar_size(v.elem_type)) return n + v.raw.size();
      if (v.elem_type == ValueType::STRING) return n + v.raw.size() - v.count + 8 * v.count;
      for (const auto& e : v.nested) n += encoded_size(e);
      return n;
    }
  }
  return 0;
}
}  // namespace

uint64_t Writer::header_size() const {
  if (header_size_valid_) return header_size_cache_;
  uint64_t n = 4 + 4 + 8 + 8;
  for (const auto& kv : kvs_) n += 8 + kv.key.size() + 4 + encoded_size(kv.value);
  for (const auto& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  header_size_cache_ = n;
  header_size_valid_ = true;
  return n;
}

uint64_t Writer::data_offset() const {
  return align_up(header_size(), alignment_ ? alignment_ : 1);
}

uint64_t Writer::tensor_offset(size_t i) const { return tensors_.at(i).offset; }
uint64_t Writer::tensor_nbytes(size_t i) const { return tensors_.at(i).nbytes; }

uint64_t Writer::total_size() const {
  return data_offset() + align_up(data_end_, alignment_ ? alignment_ : 1);
}

Result<std::vector<uint8_t>> Writer::header_bytes() const {
  XPACK_TRY(validate());
  std::vector<uint8_t> out;
  out.reserve(header_size());
  wire::put_u32(out, 0x46554747u);  // "GGUF"
  wire::put_u32(out, 3);
  wire::put_u64(out, tensors_.size());
  wire::put_u64(out, kvs_.size());
  for (const auto& kv : kvs_) {
    wire::put_string(out, kv.key);
    wire::put_u32(out, static_cast<uint32_t>(kv.value.type));
    Status s = wire::put_value(out, kv.value);
    if (!s.ok()) return err(s.error().code, "key '{}': {}", kv.key, s.error().message);
  }
  for (const auto& t : tensors_) {
    wire::put_string(out, t.name);
    wire::put_u32(out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) wire::put_u64(out, d);
    wire::put_u32(out, t.type);
    wire::put_u64(out, t.offset);
  }
  if (out.size() != header_size())
    return err(XPACK_E_INTERNAL, "GGUF header is {} bytes, {} were planned", out.size(),
               header_size());
  out.resize(data_offset(), 0);
  return out;
}

namespace {
// Sequential writer over an fd that turns short writes and EINTR into progress.
Status write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_error("write {}", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

Status write_zeros(int fd, uint64_t n, const std::string& path) {
  static const uint8_t zeros[4096] = {};
  while (n > 0) {
    size_t k = n < sizeof(zeros) ? static_cast<size_t>(n) : sizeof(zeros);
    XPACK_TRY(write_all(fd, zeros, k, path));
    n -= k;
  }
  return {};
}

Status write_body(int fd, const std::string& tmp, const Writer& w, const TensorFiller& fill) {
  XPACK_ASSIGN_OR_RETURN(std::vector<uint8_t> header, w.header_bytes());
  XPACK_TRY(write_all(fd, header.data(), header.size(), tmp));
  uint64_t pos = header.size();
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < w.tensor_count(); ++i) {
    uint64_t at = w.data_offset() + w.tensor_offset(i);
    XPACK_TRY(write_zeros(fd, at - pos, tmp));
    buf.assign(w.tensor_nbytes(i), 0);
    XPACK_TRY(fill(i, buf.data(), buf.size()));
    XPACK_TRY(write_all(fd, buf.data(), buf.size(), tmp));
    pos = at + buf.size();
  }
  XPACK_TRY(write_zeros(fd, w.total_size() - pos, tmp));
  return {};
}
}  // namespace

Status write_gguf(const std::string& path, const Writer& w, const TensorFiller& fill) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("create {}", tmp);
  Status s = write_body(fd, tmp, w, fill);
  if (s.ok() && ::fsync(fd) != 0) s = errno_error("fsync {}", tmp);
  if (::close(fd) != 0 && s.ok()) s = errno_error("close {}", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = errno_error("rename {}", path);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

namespace {
TensorFiller copy_from(const std::vector<std::vector<uint8_t>>& data) {
  return [&data](size_t i, uint8_t* dst, size_t n) -> Status {
    if (i >= data.size() || data[i].size() != n)
      return err(XPACK_E_INVALID_ARG, "tensor {}: {} data bytes given, {} expected", i,
                 i < data.size() ? data[i].size() : 0, n);
    std::memcpy(dst, data[i].data(), n);
    return {};
  };
}
}  // namespace

Status write_gguf(const std::string& path, const Writer& w,
                  const std::vector<std::vector<uint8_t>>& data) {
  if (data.size() != w.tensor_count())
    return err(XPACK_E_INVALID_ARG, "{} tensor buffers for {} tensors", data.size(),
               w.tensor_count());
  return write_gguf(path, w, copy_from(data));
}

Result<std::vector<uint8_t>> gguf_bytes(const Writer& w,
                                        const std::vector<std::vector<uint8_t>>& data) {
  if (data.size() != w.tensor_count())
    return err(XPACK_E_INVALID_ARG, "{} tensor buffers for {} tensors", data.size(),
               w.tensor_count());
  XPACK_ASSIGN_OR_RETURN(std::vector<uint8_t> out, w.header_bytes());
  out.resize(w.total_size(), 0);
  auto fill = copy_from(data);
  for (size_t i = 0; i < w.tensor_count(); ++i)
    XPACK_TRY(fill(i, out.data() + w.data_offset() + w.tensor_offset(i), w.tensor_nbytes(i)));
  return out;
}

}  // namespace xpack::gguf
