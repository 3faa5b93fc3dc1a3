// The xpack_gguf_* C API: a thin, exception-free shell over gguf::Model.
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include "capi/sized_struct.h"
#include "common/handle_message.h"
#include "common/result.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf_model.h"
#include "xpack/xpack.h"

using xpack::Error;
using xpack::gguf::Value;
using xpack::gguf::ValueType;

struct xpack_gguf {
  xpack::gguf::Model model;
  // Accessors take a const handle and may fail concurrently: one message per thread.
  xpack::HandleMessage errmsg;
};

namespace {

int fail(const xpack_gguf* g, int code, std::string msg) {
  return xpack::record_failure(g ? &g->errmsg : nullptr, code, std::move(msg));
}

int fail(const xpack_gguf* g, const Error& e) { return fail(g, e.code, e.message); }

// The value at key index `idx`, or nullptr after recording the error in *code.
const Value* key_value(const xpack_gguf* g, int64_t idx, int* code) {
  if (!g) {
    *code = fail(g, XPACK_E_INVALID_ARG, "xpack_gguf: NULL handle");
    return nullptr;
  }
  const auto& kvs = g->model.meta().kvs();
  if (idx < 0 || static_cast<uint64_t>(idx) >= kvs.size()) {
    *code = fail(g, XPACK_E_INVALID_ARG,
                 fmt::format("key index {} out of range (0..{})", idx, kvs.size()));
    return nullptr;
  }
  return &kvs[static_cast<size_t>(idx)].value;
}

const std::string& key_name_of(const xpack_gguf* g, int64_t idx) {
  return g->model.meta().kvs()[static_cast<size_t>(idx)].key;
}

bool is_signed_int(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

// Integer (or bool) value as int64, with the error codes the header promises.
int value_to_int(const xpack_gguf* g, const Value& v, const std::string& what, int64_t* out) {
  if (!v.is_int())
    return fail(g, XPACK_E_TYPE,
                fmt::format("{} has type {}, not an integer", what, value_type_name(v.type)));
  if (v.type == ValueType::U64 && v.u > static_cast<uint64_t>(INT64_MAX))
    return fail(g, XPACK_E_LIMIT, fmt::format("{} value {} does not fit in int64", what, v.u));
  if (out) *out = v.as_i64();
  return 0;
}

int value_to_float(const xpack_gguf* g, const Value& v, const std::string& what, double* out) {
  double d;
  if (v.is_float()) {
    d = v.f;
  } else if (v.is_int()) {
    d = is_signed_int(v.type) ? static_cast<double>(v.as_i64()) : static_cast<double>(v.u);
  } else {
    return fail(g, XPACK_E_TYPE,
                fmt::format("{} has type {}, not a number", what, value_type_name(v.type)));
  }
  if (out) *out = d;
  return 0;
}

int value_to_string(const xpack_gguf* g, const Value& v, const std::string& what,
                    const char** s, size_t* len) {
  if (v.type != ValueType::STRING)
    return fail(g, XPACK_E_TYPE,
                fmt::format("{} has type {}, not a string", what, value_type_name(v.type)));
  if (s) *s = v.str.c_str();
  if (len) *len = v.str.size();
  return 0;
}

// The array at key index idx if i is in range, or nullptr after recording the error.
const Value* array_elem(const xpack_gguf* g, int64_t idx, uint64_t i, int* code) {
  const Value* v = key_value(g, idx, code);
  if (!v) return nullptr;
  const std::string& key = key_name_of(g, idx);
  if (v->type != ValueType::ARRAY) {
    *code = fail(g, XPACK_E_TYPE, fmt::format("key '{}' has type {}, not an array", key,
                                              value_type_name(v->type)));
    return nullptr;
  }
  if (i >= v->array_size()) {
    *code = fail(g, XPACK_E_INVALID_ARG,
                 fmt::format("key '{}': index {} out of range ({} elements)", key, i,
                             v->array_size()));
    return nullptr;
  }
  return v;
}

const xpack::gguf::TensorInfo* tensor_at(const xpack_gguf* g, int64_t idx, int* code) {
  if (!g) {
    *code = fail(g, XPACK_E_INVALID_ARG, "xpack_gguf: NULL handle");
    return nullptr;
  }
  const auto& ts = g->model.tensors();
  if (idx < 0 || static_cast<uint64_t>(idx) >= ts.size()) {
    *code = fail(g, XPACK_E_INVALID_ARG,
                 fmt::format("tensor index {} out of range (0..{})", idx, ts.size()));
    return nullptr;
  }
  return &ts[static_cast<size_t>(idx)];
}

}  // namespace

extern "C" {

XPACK_API int xpack_type_info(uint32_t type, const char** name, uint32_t* block_elems,
                              uint32_t* block_bytes) {
  const xpack::gguf::TypeInfo* ti = xpack::gguf::type_info(type);
  if (!ti) return fail(nullptr, XPACK_E_UNKNOWN_TYPE, fmt::format("unknown ggml type id {}", type));
  if (name) *name = ti->name;
  if (block_elems) *block_elems = ti->block_elems;
  if (block_bytes) *block_bytes = ti->block_bytes;
  return 0;
}

XPACK_API int xpack_gguf_open(const char* path, const xpack_gguf_options* opts,
                              xpack_gguf** out) {
  if (!out) return fail(nullptr, XPACK_E_INVALID_ARG, "xpack_gguf_open: out is NULL");
  *out = nullptr;
  if (!path) return fail(nullptr, XPACK_E_INVALID_ARG, "xpack_gguf_open: path is NULL");
  uint32_t flags = 0;
  if (opts) {
    if (!xpack::capi::sized_struct_ok(opts))
      return fail(nullptr, XPACK_E_INVALID_ARG,
                  fmt::format("xpack_gguf_open: options size {} is too small", opts->size));
    xpack_gguf_options given{};
    xpack::capi::merge_sized_options(&given, *opts);
    flags = given.flags;
  }
  if (flags & ~static_cast<uint32_t>(XPACK_GGUF_SINGLE_FILE))
    return fail(nullptr, XPACK_E_INVALID_ARG,
                fmt::format("xpack_gguf_open: unknown flags {:#x}", flags));
  try {
    auto m = xpack::gguf::Model::open(path, (flags & XPACK_GGUF_SINGLE_FILE) != 0);
    if (!m.ok()) return fail(nullptr, m.error());
    auto* g = new xpack_gguf;
    g->model = std::move(m).value();
    *out = g;
    return 0;
  } catch (const std::bad_alloc&) {
    return fail(nullptr, -ENOMEM, fmt::format("xpack_gguf_open '{}': out of memory", path));
  } catch (const std::exception& e) {
    return fail(nullptr, XPACK_E_INTERNAL, fmt::format("xpack_gguf_open '{}': {}", path, e.what()));
  }
}

XPACK_API void xpack_gguf_close(xpack_gguf* g) { delete g; }

XPACK_API const char* xpack_gguf_errmsg(const xpack_gguf* g) {
  return g ? g->errmsg.get() : "NULL xpack_gguf handle";
}

XPACK_API uint32_t xpack_gguf_version(const xpack_gguf* g) {
  return g ? g->model.meta().version() : 0;
}

XPACK_API uint32_t xpack_gguf_shard_count(const xpack_gguf* g) {
  return g ? static_cast<uint32_t>(g->model.shards().size()) : 0;
}

XPACK_API int64_t xpack_gguf_key_count(const xpack_gguf* g) {
  if (!g) return fail(g, XPACK_E_INVALID_ARG, "xpack_gguf: NULL handle");
  return static_cast<int64_t>(g->model.meta().kvs().size());
}

XPACK_API int64_t xpack_gguf_find_key(const xpack_gguf* g, const char* key) {
  if (!g || !key) return fail(g, XPACK_E_INVALID_ARG, "xpack_gguf_find_key: NULL argument");
  const auto& kvs = g->model.meta().kvs();
  for (size_t i = 0; i < kvs.size(); ++i)
    if (kvs[i].key == key) return static_cast<int64_t>(i);
  return fail(g, XPACK_E_NOT_FOUND, fmt::format("no metadata key '{}'", key));
}

XPACK_API const char* xpack_gguf_key_name(const xpack_gguf* g, int64_t idx) {
  int code;
  if (!key_value(g, idx, &code)) return nullptr;
  return key_name_of(g, idx).c_str();
}

XPACK_API int xpack_gguf_key_type(const xpack_gguf* g, int64_t idx) {
  int code;
  const Value* v = key_value(g, idx, &code);
  return v ? static_cast<int>(v->type) : code;
}

XPACK_API int xpack_gguf_get_int(const xpack_gguf* g, int64_t idx, int64_t* out) {
  int code;
  const Value* v = key_value(g, idx, &code);
  if (!v) return code;
  return value_to_int(g, *v, fmt::format("key '{}'", key_name_of(g, idx)), out);
}

XPACK_API int xpack_gguf_get_float(const xpack_gguf* g, int64_t idx, double* out) {
  int code;
  const Value* v = key_value(g, idx, &code);
  if (!v) return code;
  return value_to_float(g, *v, fmt::format("key '{}'", key_name_of(g, idx)), out);
}

XPACK_API int xpack_gguf_get_string(const xpack_gguf* g, int64_t idx, const char** s,
                                    size_t* len) {
  int code;
  const Value* v = key_value(g, idx, &code);
  if (!v) return code;
  return value_to_string(g, *v, fmt::format("key '{}'", key_name_of(g, idx)), s, len);
}

XPACK_API int xpack_gguf_get_array(const xpack_gguf* g, int64_t idx, int* elem_type,
                                   uint64_t* n) {
  int code;
  const Value* v = key_value(g, idx, &code);
  if (!v) return code;
  if (v->type != ValueType::ARRAY)
    return fail(g, XPACK_E_TYPE, fmt::format("key '{}' has type {}, not an array",
                                             key_name_of(g, idx), value_type_name(v->type)));
  if (elem_type) *elem_type = static_cast<int>(v->elem_type);
  if (n) *n = v->array_size();
  return 0;
}

XPACK_API int xpack_gguf_get_array_int(const xpack_gguf* g, int64_t idx, uint64_t i,
                                       int64_t* out) {
  int code;
  const Value* a = array_elem(g, idx, i, &code);
  if (!a) return code;
  return value_to_int(g, a->element(i), fmt::format("key '{}'[{}]", key_name_of(g, idx), i), out);
}

XPACK_API int xpack_gguf_get_array_float(const xpack_gguf* g, int64_t idx, uint64_t i,
                                         double* out) {
  int code;
  const Value* a = array_elem(g, idx, i, &code);
  if (!a) return code;
  return value_to_float(g, a->element(i), fmt::format("key '{}'[{}]", key_name_of(g, idx), i), out);
}

XPACK_API int xpack_gguf_get_array_string(const xpack_gguf* g, int64_t idx, uint64_t i,
                                          const char** s, size_t* len) {
  int code;
  const Value* a = array_elem(g, idx, i, &code);
  if (!a) return code;
  if (a->elem_type != ValueType::STRING)
    return fail(g, XPACK_E_TYPE, fmt::format("key '{}'[{}] has type {}, not a string",
                                             key_name_of(g, idx), i, value_type_name(a->elem_type)));
  std::string_view e = a->string_element(i);  // NUL-terminated inside the array's storage
  if (s) *s = e.data();
  if (len) *len = e.size();
  return 0;
}

XPACK_API int64_t xpack_gguf_tensor_count(const xpack_gguf* g) {
  if (!g) return fail(g, XPACK_E_INVALID_ARG, "xpack_gguf: NULL handle");
  return static_cast<int64_t>(g->model.tensors().size());
}

XPACK_API int64_t xpack_gguf_find_tensor(const xpack_gguf* g, const char* name) {
  if (!g || !name) return fail(g, XPACK_E_INVALID_ARG, "xpack_gguf_find_tensor: NULL argument");
  const auto* t = g->model.find_tensor(name);
  if (!t) return fail(g, XPACK_E_NOT_FOUND, fmt::format("no tensor '{}'", name));
  return static_cast<int64_t>(t - g->model.tensors().data());
}

XPACK_API int xpack_gguf_tensor_info(const xpack_gguf* g, int64_t idx, xpack_tensor_info* out) {
  int code;
  const auto* t = tensor_at(g, idx, &code);
  if (!t) return code;
  if (!xpack::capi::sized_struct_ok(out))
    return fail(g, XPACK_E_INVALID_ARG, "xpack_gguf_tensor_info: out is NULL or its size too small");
  xpack_tensor_info i{};
  i.size = sizeof(i);
  i.name = t->name.c_str();
  i.type = t->type;
  i.n_dims = t->n_dims;
  for (int d = 0; d < 4; ++d) i.ne[d] = t->ne[static_cast<size_t>(d)];
  i.nbytes = t->nbytes;
  i.shard = t->shard;
  i.file_offset = t->file_offset;
  xpack::capi::copy_sized_out(out, i);
  return 0;
}

XPACK_API int xpack_gguf_tensor_data(xpack_gguf* g, int64_t idx, const void** data) {
  int code;
  const auto* t = tensor_at(g, idx, &code);
  if (!t) return code;
  if (!data) return fail(g, XPACK_E_INVALID_ARG, "xpack_gguf_tensor_data: data is NULL");
  try {
    auto p = g->model.tensor_data(*t);
    if (!p.ok()) return fail(g, p.error());
    *data = p.value();
    return 0;
  } catch (const std::exception& e) {
    return fail(g, XPACK_E_INTERNAL, fmt::format("xpack_gguf_tensor_data: {}", e.what()));
  }
}

}  // extern "C"
