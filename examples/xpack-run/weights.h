// Model weights and metadata as xpack-run sees them: the trunk GGUF (every
// non-expert tensor) read through libxpack's public C API, like any outside engine.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

struct xpack_gguf;

namespace xrun {

// Any problem with the model files (missing tensor or key, bad shape). The
// message names the tensor/key; main() prints it and exits 1.
struct ModelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct WeightTensor {
  std::string name;
  uint32_t type = 0;     // enum xpack_ggml_type
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] contiguous (the input dim of a matrix)
  const void* data = nullptr;    // mapped bytes, valid while Weights lives
  size_t nbytes = 0;
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
};

class Weights {
 public:
  explicit Weights(const std::string& gguf_path);  // throws ModelError
  ~Weights();
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;

  const std::string& arch() const { return arch_; }
  xpack_gguf* gguf() const { return g_; }

  // Tensors. get() throws ModelError("missing tensor NAME") when absent.
  const WeightTensor* find(const std::string& name) const;
  const WeightTensor& get(const std::string& name) const;
  // get() plus a shape check: throws if ne differs (ne of unused dims are 1).
  const WeightTensor& get(const std::string& name, std::initializer_list<int64_t> ne) const;

  // Metadata. Keys are full names ("llama.block_count"); arch_key("block_count")
  // prefixes "<arch>.". get_* throw ModelError("missing key KEY") when absent.
  std::string arch_key(const std::string& suffix) const { return arch_ + "." + suffix; }
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  // A per-layer value stored either as a scalar or as an array (one per layer).
  std::vector<double> get_per_layer(const std::string& key, int n_layers) const;

 private:
  xpack_gguf* g_ = nullptr;
  std::string arch_;
  std::vector<WeightTensor> tensors_;
};

}  // namespace xrun
