#include "gguf/gguf_model.h"

#include <sys/mman.h>

#include <cstdio>
#include <regex>

namespace xpack::gguf {

std::optional<SplitName> parse_split_name(const std::string& path) {
  static const std::regex re(R"(^(.*)-(\d{5})-of-(\d{5})\.gguf$)");
  std::smatch m;
  if (!std::regex_match(path, m, re)) return std::nullopt;
  SplitName s;
  s.prefix = m[1].str();
  s.index = static_cast<uint32_t>(std::stoul(m[2].str()));
  s.count = static_cast<uint32_t>(std::stoul(m[3].str()));
  if (s.index == 0 || s.count == 0 || s.index > s.count) return std::nullopt;
  return s;
}

std::string split_shard_path(const std::string& prefix, uint32_t index1, uint32_t count) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05u-of-%05u.gguf", index1, count);
  return prefix + buf;
}

Model::Model(Model&& o) noexcept { *this = std::move(o); }

Model& Model::operator=(Model&& o) noexcept {
  if (this != &o) {
    for (auto& m : maps_)
      if (m.addr) ::munmap(m.addr, m.len);
    shards_ = std::move(o.shards_);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    maps_ = std::move(o.maps_);
    map_mu_ = std::move(o.map_mu_);
    o.maps_.clear();
  }
  return *this;
}

Model::~Model() {
  for (auto& m : maps_)
    if (m.addr) ::munmap(m.addr, m.len);
}

namespace {

// split.* keys are u16/i32 as gguf-split writes them; accept any integer type.
Result<uint64_t> split_key(const File& f, const char* key) {
  const Value* v = f.find(key);
  if (!v) return err(XPACK_E_SPLIT, "{}: missing split key '{}'", f.path(), key);
  if (!v->is_int() || v->type == ValueType::BOOL || v->as_i64() < 0)
    return err(XPACK_E_SPLIT, "{}: split key '{}' is not a non-negative integer", f.path(), key);
  return v->u;
}

}  // namespace

Result<Model> Model::open(const std::string& path, bool single_file) {
  Model m;
  auto split = single_file ? std::nullopt : parse_split_name(path);
  if (!split) {
    XPACK_ASSIGN_OR_RETURN(File f, File::open(path));
    m.shards_.push_back(std::move(f));
  } else {
    for (uint32_t k = 1; k <= split->count; ++k) {
      std::string p = split_shard_path(split->prefix, k, split->count);
      auto f = File::open(p);
      if (!f.ok()) {
        Error e = std::move(f).error();
        if (e.code == -ENOENT)
          return err(XPACK_E_SPLIT, "split set of '{}': shard {} of {} is missing ({})", path, k,
                     split->count, p);
        return e;
      }
      m.shards_.push_back(std::move(f).value());
    }
    uint64_t total_tensors = 0;
    for (uint32_t k = 0; k < split->count; ++k) {
      const File& f = m.shards_[k];
      XPACK_ASSIGN_OR_RETURN(uint64_t no, split_key(f, "split.no"));
      XPACK_ASSIGN_OR_RETURN(uint64_t count, split_key(f, "split.count"));
      XPACK_ASSIGN_OR_RETURN(uint64_t ntens, split_key(f, "split.tensors.count"));
      if (no != k)
        return err(XPACK_E_SPLIT, "{}: split.no is {} but the file name says shard {}", f.path(), no, k);
      if (count != split->count)
        return err(XPACK_E_SPLIT, "{}: split.count is {} but the file names say {}", f.path(), count,
                   split->count);
      XPACK_ASSIGN_OR_RETURN(uint64_t ntens0, split_key(m.shards_[0], "split.tensors.count"));
      if (ntens != ntens0)
        return err(XPACK_E_SPLIT, "{}: split.tensors.count {} differs from shard 1's {}", f.path(),
                   ntens, ntens0);
      total_tensors += f.tensors().size();
    }
    XPACK_ASSIGN_OR_RETURN(uint64_t declared, split_key(m.shards_[0], "split.tensors.count"));
    if (declared != total_tensors)
      return err(XPACK_E_SPLIT, "split set of '{}': split.tensors.count is {} but the shards hold {} tensors",
                 path, declared, total_tensors);
  }
  for (uint32_t k = 0; k < m.shards_.size(); ++k) {
    for (const auto& t : m.shards_[k].tensors()) {
      TensorInfo ti = t;
      ti.shard = k;
      if (!m.index_.emplace(ti.name, m.tensors_.size()).second)
        return err(XPACK_E_DUPLICATE, "split set of '{}': tensor '{}' appears in two shards", path, ti.name);
      m.tensors_.push_back(std::move(ti));
    }
  }
  m.maps_.resize(m.shards_.size());
  return m;
}

const TensorInfo* Model::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::string Model::arch() const {
  auto s = meta().get_string("general.architecture");
  return s.ok() ? s.value() : std::string();
}

Result<const uint8_t*> Model::tensor_data(const TensorInfo& t) const {
  if (t.shard >= shards_.size()) return err(XPACK_E_INVALID_ARG, "tensor '{}': bad shard", t.name);
  std::lock_guard<std::mutex> lock(*map_mu_);
  Mapping& mp = maps_[t.shard];
  if (!mp.addr) {
    const File& f = shards_[t.shard];
    if (f.file_size() == 0) return err(XPACK_E_TRUNCATED, "{}: empty file", f.path());
    void* a = ::mmap(nullptr, f.file_size(), PROT_READ, MAP_SHARED, f.fd(), 0);
    if (a == MAP_FAILED) return errno_error("mmap '{}'", f.path());
    mp.addr = a;
    mp.len = f.file_size();
  }
  return static_cast<const uint8_t*>(mp.addr) + t.file_offset;
}

}  // namespace xpack::gguf
