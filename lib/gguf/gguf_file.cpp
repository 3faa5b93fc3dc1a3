// GGUF parsing. Every length and count read from the file is checked against the
// bytes that remain before anything is allocated, so a hostile file can make us
// allocate at most about its own size.
#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/checked_math.h"
#include "common/open_input.h"
#include "gguf/ggml_type.h"

namespace xpack::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian

class FdSource : public ByteSource {
 public:
  FdSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  uint64_t size() const override { return size_; }
  Status read(uint64_t off, void* dst, size_t n) override {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(off));
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno_error("pread at offset {}", off);
      }
      if (r == 0) return err(XPACK_E_TRUNCATED, "file shrank while reading (offset {})", off);
      p += r;
      n -= static_cast<size_t>(r);
      off += static_cast<uint64_t>(r);
    }
    return {};
  }

 private:
  int fd_;
  uint64_t size_;
};

// Sequential reader with a read-ahead buffer over a ByteSource.
class Cursor {
 public:
  Cursor(ByteSource& src, const std::string& name) : src_(src), name_(name) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return src_.size() - pos_; }

  Status bytes(void* dst, uint64_t n, const char* what) {
    if (n > remaining())
      return err(XPACK_E_TRUNCATED, "{}: truncated while reading {} at offset {} ({} bytes needed, {} left)",
                 name_, what, pos_, n, remaining());
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ >= buf_start_ + buf_.size() || pos_ < buf_start_) {
        XPACK_TRY(fill());
      }
      uint64_t in_buf = buf_start_ + buf_.size() - pos_;
      uint64_t take = std::min(n, in_buf);
      std::memcpy(out, buf_.data() + (pos_ - buf_start_), take);
      out += take;
      n -= take;
      pos_ += take;
    }
    return {};
  }

  template <typename T>
  Result<T> scalar(const char* what) {
    T v{};
    XPACK_TRY(bytes(&v, sizeof v, what));
    return v;
  }

  Result<std::string> string(uint64_t max_len, const char* what) {
    XPACK_ASSIGN_OR_RETURN(uint64_t len, scalar<uint64_t>(what));
    if (len > max_len)
      return err(XPACK_E_LIMIT, "{}: {} length {} at offset {} exceeds the limit {}", name_, what,
                 len, pos_ - 8, max_len);
    if (len > remaining())
      return err(XPACK_E_TRUNCATED, "{}: {} length {} at offset {} runs past the end of the file",
                 name_, what, len, pos_ - 8);
    std::string s(len, '\0');
    XPACK_TRY(bytes(s.data(), len, what));
    return s;
  }

  const std::string& name() const { return name_; }

 private:
  Status fill() {
    uint64_t n = std::min<uint64_t>(kChunk, remaining());
    buf_.resize(n);
    buf_start_ = pos_;
    return src_.read(pos_, buf_.data(), n);
  }

  static constexpr uint64_t kChunk = 1 << 20;
  ByteSource& src_;
  std::string name_;
  uint64_t pos_ = 0;
  uint64_t buf_start_ = 0;
  std::vector<uint8_t> buf_;
};

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

Status read_value(Cursor& c, ValueType type, Value& v, uint32_t depth, const std::string& key) {
  v.type = type;
  switch (type) {
    case ValueType::U8: { XPACK_ASSIGN_OR_RETURN(uint8_t x, c.scalar<uint8_t>("u8")); v.u = x; break; }
    case ValueType::I8: { XPACK_ASSIGN_OR_RETURN(int8_t x, c.scalar<int8_t>("i8")); v.u = static_cast<uint64_t>(static_cast<int64_t>(x)); break; }
    case ValueType::U16: { XPACK_ASSIGN_OR_RETURN(uint16_t x, c.scalar<uint16_t>("u16")); v.u = x; break; }
    case ValueType::I16: { XPACK_ASSIGN_OR_RETURN(int16_t x, c.scalar<int16_t>("i16")); v.u = static_cast<uint64_t>(static_cast<int64_t>(x)); break; }
    case ValueType::U32: { XPACK_ASSIGN_OR_RETURN(uint32_t x, c.scalar<uint32_t>("u32")); v.u = x; break; }
    case ValueType::I32: { XPACK_ASSIGN_OR_RETURN(int32_t x, c.scalar<int32_t>("i32")); v.u = static_cast<uint64_t>(static_cast<int64_t>(x)); break; }
    case ValueType::U64: { XPACK_ASSIGN_OR_RETURN(uint64_t x, c.scalar<uint64_t>("u64")); v.u = x; break; }
    case ValueType::I64: { XPACK_ASSIGN_OR_RETURN(int64_t x, c.scalar<int64_t>("i64")); v.u = static_cast<uint64_t>(x); break; }
    case ValueType::F32: { XPACK_ASSIGN_OR_RETURN(float x, c.scalar<float>("f32")); v.f = x; break; }
    case ValueType::F64: { XPACK_ASSIGN_OR_RETURN(double x, c.scalar<double>("f64")); v.f = x; break; }
    case ValueType::BOOL: {
      XPACK_ASSIGN_OR_RETURN(uint8_t x, c.scalar<uint8_t>("bool"));
      if (x > 1)
        return err(XPACK_E_FORMAT, "{}: key '{}': bool value {} is neither 0 nor 1", c.name(), key, x);
      v.u = x;
      break;
    }
    case ValueType::STRING: {
      XPACK_ASSIGN_OR_RETURN(v.str, c.string(kMaxStringBytes, "string value"));
      break;
    }
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        return err(XPACK_E_LIMIT, "{}: key '{}': arrays nested deeper than {}", c.name(), key, kMaxArrayDepth);
      XPACK_ASSIGN_OR_RETURN(uint32_t et, c.scalar<uint32_t>("array type"));
      if (!valid_type(et))
        return err(XPACK_E_FORMAT, "{}: key '{}': unknown array element type {}", c.name(), key, et);
      XPACK_ASSIGN_OR_RETURN(uint64_t n, c.scalar<uint64_t>("array count"));
      v.elem_type = static_cast<ValueType>(et);
      // Every element takes at least one byte (strings and arrays at least 8), so
      // a count larger than the bytes left is a lie we refuse before allocating.
      uint64_t min_elem = scalar_size(v.elem_type);
      if (min_elem == 0) min_elem = (v.elem_type == ValueType::ARRAY) ? 12 : 8;
      if (n > c.remaining() / min_elem)
        return err(XPACK_E_TRUNCATED, "{}: key '{}': array of {} elements cannot fit in the {} bytes left",
                   c.name(), key, n, c.remaining());
      v.count = n;
      if (size_t sz = scalar_size(v.elem_type)) {
        v.raw.resize(n * sz);
        XPACK_TRY(c.bytes(v.raw.data(), n * sz, "array elements"));
        if (v.elem_type == ValueType::BOOL)
          for (uint64_t i = 0; i < n; ++i)
            if (static_cast<uint8_t>(v.raw[i]) > 1)
              return err(XPACK_E_FORMAT, "{}: key '{}': bool element {} is neither 0 nor 1",
                         c.name(), key, i);
      } else if (v.elem_type == ValueType::STRING) {
        v.ends.reserve(n);
        for (uint64_t i = 0; i < n; ++i) {
          XPACK_ASSIGN_OR_RETURN(uint64_t len, c.scalar<uint64_t>("string length"));
          if (len > kMaxStringBytes)
            return err(XPACK_E_LIMIT, "{}: key '{}': string element {} length {} exceeds the limit {}",
                       c.name(), key, i, len, kMaxStringBytes);
          if (len > c.remaining())
            return err(XPACK_E_TRUNCATED, "{}: key '{}': string element {} runs past the end of the file",
                       c.name(), key, i);
          size_t at = v.raw.size();
          v.raw.resize(at + len + 1);
          XPACK_TRY(c.bytes(v.raw.data() + at, len, "string element"));
          v.raw[at + len] = '\0';
          v.ends.push_back(at + len);
        }
      } else {
        v.nested.resize(n);
        for (uint64_t i = 0; i < n; ++i)
          XPACK_TRY(read_value(c, v.elem_type, v.nested[i], depth + 1, key));
      }
      break;
    }
    default:
      return err(XPACK_E_FORMAT, "{}: key '{}': unknown value type {}", c.name(), key,
                 static_cast<uint32_t>(type));
  }
  return {};
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

namespace {
// Decodes one scalar of type t from its little-endian bytes.
Value decode_scalar(ValueType t, const char* p) {
  Value v;
  v.type = t;
  switch (t) {
    case ValueType::U8: case ValueType::BOOL: v.u = static_cast<uint8_t>(*p); break;
    case ValueType::I8: v.u = static_cast<uint64_t>(int64_t{static_cast<int8_t>(*p)}); break;
    case ValueType::U16: { uint16_t x; std::memcpy(&x, p, 2); v.u = x; break; }
    case ValueType::I16: { int16_t x; std::memcpy(&x, p, 2); v.u = static_cast<uint64_t>(int64_t{x}); break; }
    case ValueType::U32: { uint32_t x; std::memcpy(&x, p, 4); v.u = x; break; }
    case ValueType::I32: { int32_t x; std::memcpy(&x, p, 4); v.u = static_cast<uint64_t>(int64_t{x}); break; }
    case ValueType::U64: case ValueType::I64: std::memcpy(&v.u, p, 8); break;
    case ValueType::F32: { float x; std::memcpy(&x, p, 4); v.f = x; break; }
    case ValueType::F64: std::memcpy(&v.f, p, 8); break;
    default: break;
  }
  return v;
}
}  // namespace

std::string_view Value::string_element(uint64_t i) const {
  uint64_t begin = i == 0 ? 0 : ends[i - 1] + 1;
  return std::string_view(raw.data() + begin, ends[i] - begin);
}

Value Value::element(uint64_t i) const {
  if (size_t sz = scalar_size(elem_type)) return decode_scalar(elem_type, raw.data() + i * sz);
  if (elem_type == ValueType::STRING) {
    Value v;
    v.type = ValueType::STRING;
    v.str = std::string(string_element(i));
    return v;
  }
  return nested[i];
}

Result<Value> Value::make_array(ValueType elem_type, const std::vector<Value>& elems) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = elem_type;
  r.count = elems.size();
  size_t sz = scalar_size(elem_type);
  for (size_t i = 0; i < elems.size(); ++i) {
    const Value& e = elems[i];
    if (e.type != elem_type)
      return err(XPACK_E_INVALID_ARG, "array element {} has type {}, array holds {}", i,
                 value_type_name(e.type), value_type_name(elem_type));
    if (sz) {
      char buf[8];
      if (e.is_float()) {
        if (elem_type == ValueType::F32) {
          float x = static_cast<float>(e.f);
          std::memcpy(buf, &x, 4);
        } else {
          std::memcpy(buf, &e.f, 8);
        }
      } else {
        std::memcpy(buf, &e.u, sz);  // little-endian host: the low bytes
      }
      r.raw.append(buf, sz);
    } else if (elem_type == ValueType::STRING) {
      r.raw.append(e.str);
      r.ends.push_back(r.raw.size());
      r.raw.push_back('\0');
    } else {
      r.nested.push_back(e);
    }
  }
  return r;
}

bool Value::is_int() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
    case ValueType::BOOL: return true;
    default: return false;
  }
}

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    file_size_ = o.file_size_;
    kvs_ = std::move(o.kvs_);
    kv_index_ = std::move(o.kv_index_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

Result<File> File::open(const std::string& path) {
  XPACK_ASSIGN_OR_RETURN(InputFile in, open_input(path, O_RDONLY));
  const int fd = in.fd;
  const struct stat& st = in.st;
  FdSource src(fd, static_cast<uint64_t>(st.st_size));
  auto r = parse(src, path);
  if (!r.ok()) {
    ::close(fd);
    return std::move(r).error();
  }
  File f = std::move(r).value();
  f.fd_ = fd;
  return f;
}

Result<File> File::parse(ByteSource& src, std::string name) {
  File f;
  f.path_ = name;
  f.file_size_ = src.size();
  Cursor c(src, name);

  XPACK_ASSIGN_OR_RETURN(uint32_t magic, c.scalar<uint32_t>("magic"));
  // "XPAC", the start of an Expert Pack's magic: the pack given where a GGUF belongs.
  if (magic == 0x43415058u)
    return err(XPACK_E_BAD_MAGIC, "{}: is an Expert Pack, not a GGUF (the model to open with it is its "
               "PREFIX.trunk.gguf)", name);
  if (magic != kMagic) return err(XPACK_E_BAD_MAGIC, "{}: not a GGUF file (magic {:#010x})", name, magic);
  XPACK_ASSIGN_OR_RETURN(f.version_, c.scalar<uint32_t>("version"));
  if (f.version_ != 2 && f.version_ != 3)
    return err(XPACK_E_VERSION, "{}: GGUF version {} is not supported (2 and 3 are)", name, f.version_);
  XPACK_ASSIGN_OR_RETURN(uint64_t n_tensors, c.scalar<uint64_t>("tensor count"));
  XPACK_ASSIGN_OR_RETURN(uint64_t n_kv, c.scalar<uint64_t>("metadata count"));
  if (n_tensors > kMaxTensors)
    return err(XPACK_E_LIMIT, "{}: tensor count {} exceeds the limit {}", name, n_tensors, kMaxTensors);
  if (n_kv > kMaxKvs) return err(XPACK_E_LIMIT, "{}: metadata count {} exceeds the limit {}", name, n_kv, kMaxKvs);
  // A key-value takes at least 8+1+4+1 bytes and a tensor info 8+1+4+8+4+8.
  if (n_kv > c.remaining() / 14 || n_tensors > c.remaining() / 33)
    return err(XPACK_E_TRUNCATED, "{}: {} metadata entries and {} tensors cannot fit in a {}-byte file",
               name, n_kv, n_tensors, f.file_size_);

  f.kvs_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv;
    XPACK_ASSIGN_OR_RETURN(kv.key, c.string(kMaxKeyBytes, "key"));
    XPACK_ASSIGN_OR_RETURN(uint32_t t, c.scalar<uint32_t>("value type"));
    if (!valid_type(t))
      return err(XPACK_E_FORMAT, "{}: key '{}': unknown value type {}", name, kv.key, t);
    XPACK_TRY(read_value(c, static_cast<ValueType>(t), kv.value, 0, kv.key));
    if (!f.kv_index_.emplace(kv.key, f.kvs_.size()).second)
      return err(XPACK_E_DUPLICATE, "{}: duplicate metadata key '{}'", name, kv.key);
    f.kvs_.push_back(std::move(kv));
  }

  if (const Value* a = f.find("general.alignment")) {
    if (!a->is_int() || a->type == ValueType::BOOL)
      return err(XPACK_E_FORMAT, "{}: general.alignment has type {}, expected an integer", name,
                 value_type_name(a->type));
    uint64_t al = a->u;
    if (al == 0 || al % 8 != 0 || al > (1u << 30))
      return err(XPACK_E_FORMAT, "{}: general.alignment {} is not a positive multiple of 8", name, al);
    f.alignment_ = al;
  }

  f.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    XPACK_ASSIGN_OR_RETURN(t.name, c.string(kMaxTensorNameBytes, "tensor name"));
    XPACK_ASSIGN_OR_RETURN(t.n_dims, c.scalar<uint32_t>("n_dims"));
    if (t.n_dims == 0 || t.n_dims > 4)
      return err(XPACK_E_FORMAT, "{}: tensor '{}' has {} dimensions (1..4 allowed)", name, t.name, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      XPACK_ASSIGN_OR_RETURN(t.ne[d], c.scalar<uint64_t>("dimension"));
      if (static_cast<int64_t>(t.ne[d]) < 0)
        return err(XPACK_E_FORMAT, "{}: tensor '{}' dimension {} is negative ({})", name, t.name, d,
                   static_cast<int64_t>(t.ne[d]));
    }
    XPACK_ASSIGN_OR_RETURN(t.type, c.scalar<uint32_t>("tensor type"));
    XPACK_ASSIGN_OR_RETURN(t.offset, c.scalar<uint64_t>("tensor offset"));
    if (!type_info(t.type))
      return err(XPACK_E_UNKNOWN_TYPE, "{}: tensor '{}' has unknown ggml type id {}", name, t.name, t.type);
    XPACK_ASSIGN_OR_RETURN(t.nbytes, tensor_nbytes(t.type, t.ne.data(), t.n_dims, t.name));
    if (t.offset % f.alignment_ != 0)
      return err(XPACK_E_MISALIGNED, "{}: tensor '{}' offset {} is not a multiple of the alignment {}",
                 name, t.name, t.offset, f.alignment_);
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second)
      return err(XPACK_E_DUPLICATE, "{}: duplicate tensor name '{}'", name, t.name);
    f.tensors_.push_back(std::move(t));
  }

  f.data_offset_ = align_up(c.pos(), f.alignment_);
  if (f.data_offset_ > f.file_size_ && !f.tensors_.empty())
    return err(XPACK_E_TRUNCATED, "{}: tensor data would start at {} past the end of the {}-byte file",
               name, f.data_offset_, f.file_size_);

  // Ranges: inside the file and pairwise disjoint (checked on the sorted order).
  std::vector<size_t> order(f.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (auto& t : f.tensors_) {
    auto abs = checked_add(f.data_offset_, t.offset);
    auto end = abs ? checked_add(*abs, t.nbytes) : std::nullopt;
    if (!end || *end > f.file_size_)
      return err(XPACK_E_TRUNCATED, "{}: tensor '{}' (offset {}, {} bytes) ends past the end of the {}-byte file",
                 name, t.name, t.offset, t.nbytes, f.file_size_);
    t.file_offset = *abs;
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = f.tensors_[order[i - 1]];
    const auto& cur = f.tensors_[order[i]];
    if (prev.nbytes > 0 && cur.nbytes > 0 && prev.offset + prev.nbytes > cur.offset)
      return err(XPACK_E_OVERLAP, "{}: tensors '{}' and '{}' overlap", name, prev.name, cur.name);
  }
  return f;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return err(XPACK_E_NOT_FOUND, "{}: missing metadata key '{}'", path_, key);
  if (!v->is_int() || v->type == ValueType::BOOL)
    return err(XPACK_E_TYPE, "{}: key '{}' has type {}, expected an integer", path_, key, value_type_name(v->type));
  bool is_signed = v->type == ValueType::I8 || v->type == ValueType::I16 ||
                   v->type == ValueType::I32 || v->type == ValueType::I64;
  if (is_signed && v->as_i64() < 0)
    return err(XPACK_E_FORMAT, "{}: key '{}' is negative ({})", path_, key, v->as_i64());
  return v->u;
}

Result<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return err(XPACK_E_NOT_FOUND, "{}: missing metadata key '{}'", path_, key);
  if (!v->is_int())
    return err(XPACK_E_TYPE, "{}: key '{}' has type {}, expected an integer", path_, key, value_type_name(v->type));
  if (v->type == ValueType::U64 && v->u > static_cast<uint64_t>(INT64_MAX))
    return err(XPACK_E_LIMIT, "{}: key '{}' value {} does not fit in int64", path_, key, v->u);
  return v->as_i64();
}

Result<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return err(XPACK_E_NOT_FOUND, "{}: missing metadata key '{}'", path_, key);
  if (v->type != ValueType::STRING)
    return err(XPACK_E_TYPE, "{}: key '{}' has type {}, expected a string", path_, key, value_type_name(v->type));
  return v->str;
}

}  // namespace xpack::gguf
