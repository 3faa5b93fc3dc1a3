// Weights over libxpack's public GGUF API: the runtime reads its trunk exactly
// as an outside engine would, never through libxpack internals.
#include "weights.h"

#include <string>

#include "xpack/xpack.h"

namespace xrun {

namespace {

std::string describe(int rc) { return std::string(xpack_strerror(rc)); }

}  // namespace

Weights::Weights(const std::string& gguf_path) {
  int rc = xpack_gguf_open(gguf_path.c_str(), nullptr, &g_);
  if (rc != 0) {
    throw ModelError("cannot open model " + gguf_path + ": " + xpack_last_error() + " (" +
                     describe(rc) + ")");
  }
  try {
    arch_ = get_string("general.architecture");
    int64_t n = xpack_gguf_tensor_count(g_);
    tensors_.reserve(static_cast<size_t>(n > 0 ? n : 0));
    for (int64_t i = 0; i < n; ++i) {
      xpack_tensor_info info{};
      info.size = sizeof(info);
      rc = xpack_gguf_tensor_info(g_, i, &info);
      if (rc != 0) throw ModelError("tensor #" + std::to_string(i) + ": " + xpack_gguf_errmsg(g_));
      WeightTensor t;
      t.name = info.name;
      t.type = info.type;
      t.n_dims = static_cast<int>(info.n_dims);
      for (int d = 0; d < 4; ++d) t.ne[d] = static_cast<int64_t>(info.ne[d]);
      t.nbytes = static_cast<size_t>(info.nbytes);
      const void* data = nullptr;
      rc = xpack_gguf_tensor_data(g_, i, &data);
      if (rc != 0) throw ModelError("tensor " + t.name + ": " + xpack_gguf_errmsg(g_));
      t.data = data;
      tensors_.push_back(std::move(t));
    }
  } catch (...) {
    xpack_gguf_close(g_);
    g_ = nullptr;
    throw;
  }
}

Weights::~Weights() { xpack_gguf_close(g_); }

const WeightTensor* Weights::find(const std::string& name) const {
  int64_t idx = xpack_gguf_find_tensor(g_, name.c_str());
  if (idx < 0 || idx >= static_cast<int64_t>(tensors_.size())) return nullptr;
  return &tensors_[static_cast<size_t>(idx)];
}

const WeightTensor& Weights::get(const std::string& name) const {
  const WeightTensor* t = find(name);
  if (!t) throw ModelError("missing tensor " + name);
  return *t;
}

const WeightTensor& Weights::get(const std::string& name, std::initializer_list<int64_t> ne) const {
  const WeightTensor& t = get(name);
  int64_t want[4] = {1, 1, 1, 1};
  int d = 0;
  for (int64_t v : ne) {
    if (d < 4) want[d] = v;
    ++d;
  }
  auto shape = [](const int64_t* s) {
    return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
           ", " + std::to_string(s[3]) + "]";
  };
  for (int i = 0; i < 4; ++i) {
    if (t.ne[i] != want[i]) {
      throw ModelError("tensor " + name + " has shape " + shape(t.ne) + ", expected " + shape(want));
    }
  }
  return t;
}

bool Weights::has(const std::string& key) const { return xpack_gguf_find_key(g_, key.c_str()) >= 0; }

namespace {

int64_t key_index(xpack_gguf* g, const std::string& key) {
  int64_t idx = xpack_gguf_find_key(g, key.c_str());
  if (idx < 0) throw ModelError("missing key " + key);
  return idx;
}

}  // namespace

int64_t Weights::get_int(const std::string& key) const {
  int64_t v = 0;
  int rc = xpack_gguf_get_int(g_, key_index(g_, key), &v);
  if (rc != 0) throw ModelError("key " + key + " is not an integer: " + describe(rc));
  return v;
}

int64_t Weights::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double Weights::get_float(const std::string& key) const {
  double v = 0;
  int rc = xpack_gguf_get_float(g_, key_index(g_, key), &v);
  if (rc != 0) throw ModelError("key " + key + " is not a number: " + describe(rc));
  return v;
}

double Weights::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool Weights::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  return get_int(key) != 0;
}

std::string Weights::get_string(const std::string& key) const {
  const char* s = nullptr;
  size_t len = 0;
  int rc = xpack_gguf_get_string(g_, key_index(g_, key), &s, &len);
  if (rc != 0) throw ModelError("key " + key + " is not a string: " + describe(rc));
  return std::string(s, len);
}

namespace {

uint64_t array_length(xpack_gguf* g, int64_t idx, const std::string& key) {
  int elem_type = 0;
  uint64_t n = 0;
  int rc = xpack_gguf_get_array(g, idx, &elem_type, &n);
  if (rc != 0) throw ModelError("key " + key + " is not an array: " + xpack_strerror(rc));
  return n;
}

}  // namespace

std::vector<int64_t> Weights::get_int_array(const std::string& key) const {
  int64_t idx = key_index(g_, key);
  uint64_t n = array_length(g_, idx, key);
  std::vector<int64_t> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    int rc = xpack_gguf_get_array_int(g_, idx, i, &out[i]);
    if (rc != 0) throw ModelError("key " + key + "[" + std::to_string(i) + "]: " + describe(rc));
  }
  return out;
}

std::vector<double> Weights::get_float_array(const std::string& key) const {
  int64_t idx = key_index(g_, key);
  uint64_t n = array_length(g_, idx, key);
  std::vector<double> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    int rc = xpack_gguf_get_array_float(g_, idx, i, &out[i]);
    if (rc != 0) throw ModelError("key " + key + "[" + std::to_string(i) + "]: " + describe(rc));
  }
  return out;
}

std::vector<std::string> Weights::get_string_array(const std::string& key) const {
  int64_t idx = key_index(g_, key);
  uint64_t n = array_length(g_, idx, key);
  std::vector<std::string> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    const char* s = nullptr;
    size_t len = 0;
    int rc = xpack_gguf_get_array_string(g_, idx, i, &s, &len);
    if (rc != 0) throw ModelError("key " + key + "[" + std::to_string(i) + "]: " + describe(rc));
    out[i].assign(s, len);
  }
  return out;
}

std::vector<double> Weights::get_per_layer(const std::string& key, int n_layers) const {
  int64_t idx = key_index(g_, key);
  if (xpack_gguf_key_type(g_, idx) == XPACK_GGUF_ARRAY) {
    std::vector<double> v = get_float_array(key);
    if (static_cast<int>(v.size()) != n_layers) {
      throw ModelError("key " + key + " has " + std::to_string(v.size()) + " values, expected one per layer (" +
                       std::to_string(n_layers) + ")");
    }
    return v;
  }
  return std::vector<double>(static_cast<size_t>(n_layers), get_float(key));
}

}  // namespace xrun
