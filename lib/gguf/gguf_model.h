// A model stored as one GGUF file or as a gguf-split set (NAME-0000k-of-0000N.gguf):
// one metadata view (shard 0) and one tensor table across all shards.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf_file.h"

namespace xpack::gguf {

// If `path` ends in -KKKKK-of-NNNNN.gguf, returns (prefix, k, n) (k is 1-based).
struct SplitName {
  std::string prefix;
  uint32_t index = 0;
  uint32_t count = 0;
};
std::optional<SplitName> parse_split_name(const std::string& path);
std::string split_shard_path(const std::string& prefix, uint32_t index1, uint32_t count);

class Model {
 public:
  // Opens `path`; if it names a shard of a split set (and !single_file), opens all
  // shards and checks split.no / split.count / split.tensors.count.
  static Result<Model> open(const std::string& path, bool single_file = false);

  Model() = default;
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const File& meta() const { return shards_[0]; }   // metadata lives in shard 0
  const std::vector<File>& shards() const { return shards_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // .shard set
  const TensorInfo* find_tensor(std::string_view name) const;
  std::string arch() const;  // general.architecture or ""

  // Read-only mapping of a tensor's bytes (maps the shard on first use).
  Result<const uint8_t*> tensor_data(const TensorInfo& t) const;

 private:
  std::vector<File> shards_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  struct Mapping { void* addr = nullptr; size_t len = 0; };
  mutable std::vector<Mapping> maps_;
  mutable std::unique_ptr<std::mutex> map_mu_ = std::make_unique<std::mutex>();
};

}  // namespace xpack::gguf
