#include "pack/pack_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/open_input.h"
#include "gguf/gguf_file.h"
#include "pack/file_io.h"
#include "pack/identity.h"
#include "pack/trunk.h"

namespace xpack::pack {

namespace {

class FdIndexSource : public IndexSource {
 public:
  FdIndexSource(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  Status read(uint64_t off, void* dst, size_t n) override { return pread_full(fd_, dst, n, off, name_); }

 private:
  int fd_;
  std::string name_;
};

// Objects read per pread while validating (bounded memory, large sequential reads).
constexpr uint64_t kValidateChunkBytes = 64ull << 20;

}  // namespace

PackReader::PackReader(PackReader&& o) noexcept
    : path_(std::move(o.path_)),
      trunk_path_(std::move(o.trunk_path_)),
      fd_(std::exchange(o.fd_, -1)),
      idx_(std::move(o.idx_)) {}

PackReader& PackReader::operator=(PackReader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    trunk_path_ = std::move(o.trunk_path_);
    fd_ = std::exchange(o.fd_, -1);
    idx_ = std::move(o.idx_);
  }
  return *this;
}

PackReader::~PackReader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<PackReader> PackReader::open(const std::string& path, const OpenOptions& opts) {
  PackReader r;
  r.path_ = path;
  XPACK_ASSIGN_OR_RETURN(InputFile in, open_input(path, O_RDONLY));
  r.fd_ = in.fd;
  XPACK_ASSIGN_OR_RETURN(uint64_t size, file_size_of(r.fd_, path));
  FdIndexSource src(r.fd_, path);
  XPACK_ASSIGN_OR_RETURN(r.idx_, decode_index(src, size, path));
  if (!opts.trunk_path.empty()) XPACK_TRY(check_identity(r.idx_, opts.trunk_path));
  r.trunk_path_ = opts.trunk_path;
  return r;
}

std::string PackReader::source_identity_hex() const { return to_hex(idx_.source_identity); }

std::optional<uint32_t> PackReader::layer_slot(uint32_t block) const {
  auto it = std::lower_bound(idx_.layer_blocks.begin(), idx_.layer_blocks.end(), block);
  if (it == idx_.layer_blocks.end() || *it != block) return std::nullopt;
  return static_cast<uint32_t>(it - idx_.layer_blocks.begin());
}

int PackReader::find_role(const std::string& name) const {
  for (size_t i = 0; i < idx_.roles.size(); ++i)
    if (idx_.roles[i].name == name) return static_cast<int>(i);
  return -1;
}

uint64_t PackReader::object_checksum(uint32_t layer_slot, uint32_t expert) const {
  uint64_t obj = uint64_t(layer_slot) * idx_.n_experts + expert;
  return idx_.checksums[idx_.checksum_row(obj)];
}

uint64_t PackReader::role_checksum(uint32_t layer_slot, uint32_t expert, uint32_t role) const {
  uint64_t obj = uint64_t(layer_slot) * idx_.n_experts + expert;
  return idx_.checksums[idx_.checksum_row(obj) + 1 + role];
}

Status PackReader::read_object(uint32_t layer_slot, uint32_t expert, void* buf, size_t buf_size,
                               bool verify) const {
  if (!valid_object(layer_slot, expert))
    return err(XPACK_E_INVALID_ARG, "{}: no object ({}, {}) in a pack of {} layers x {} experts", path_,
               layer_slot, expert, n_layers(), n_experts());
  if (buf == nullptr || buf_size < idx_.object_bytes)
    return err(XPACK_E_INVALID_ARG, "buffer of {} bytes is smaller than an object ({} bytes)", buf_size,
               idx_.object_bytes);
  XPACK_TRY(pread_full(fd_, buf, idx_.object_bytes, object_offset(layer_slot, expert), path_));
  if (verify && xxh3(buf, idx_.object_bytes) != object_checksum(layer_slot, expert))
    return err(XPACK_E_OBJECT_CHECKSUM, "{}: object (layer {}, expert {}) is damaged", path_,
               idx_.layer_blocks[layer_slot], expert);
  return {};
}

Status PackReader::validate(ValidateLevel level, Fault* fault,
                            void (*progress)(uint64_t, uint64_t, void*), void* ctx) const {
  // Structure: decode the index again from disk so damage since open is caught too.
  XPACK_ASSIGN_OR_RETURN(uint64_t size, file_size_of(fd_, path_));
  FdIndexSource src(fd_, path_);
  XPACK_ASSIGN_OR_RETURN(Index again, decode_index(src, size, path_));
  if (again.checksums != idx_.checksums || again.object_stride != idx_.object_stride)
    return err(XPACK_E_CHECKSUM, "{}: index changed since the pack was opened", path_);
  if (level == ValidateLevel::kStructure) return {};

  const uint64_t n_obj = n_objects();
  const uint64_t per_chunk = std::max<uint64_t>(1, kValidateChunkBytes / idx_.object_stride);
  std::vector<uint8_t> buf(per_chunk * idx_.object_stride);
  // The padding after each payload is documented as zeros; no checksum covers it.
  const std::vector<uint8_t> zeros(idx_.object_stride - idx_.object_bytes, 0);
  for (uint64_t first = 0; first < n_obj; first += per_chunk) {
    uint64_t count = std::min(per_chunk, n_obj - first);
    XPACK_TRY(pread_full(fd_, buf.data(), count * idx_.object_stride, idx_.data_start + first * idx_.object_stride,
                         path_));
    for (uint64_t k = 0; k < count; ++k) {
      uint64_t obj = first + k;
      const uint8_t* p = buf.data() + k * idx_.object_stride;
      size_t row = idx_.checksum_row(obj);
      const bool payload_ok = xxh3(p, idx_.object_bytes) == idx_.checksums[row];
      const bool padding_ok =
          zeros.empty() || std::memcmp(p + idx_.object_bytes, zeros.data(), zeros.size()) == 0;
      if (payload_ok && padding_ok) continue;
      Fault f;
      f.layer_slot = static_cast<uint32_t>(obj / idx_.n_experts);
      f.block = idx_.layer_blocks[f.layer_slot];
      f.expert = static_cast<uint32_t>(obj % idx_.n_experts);
      for (size_t r = 0; r < idx_.roles.size(); ++r) {
        const Role& role = idx_.roles[r];
        if (xxh3(p + role.offset, role.nbytes) != idx_.checksums[row + 1 + r]) {
          f.role = static_cast<int32_t>(r);
          break;
        }
      }
      if (payload_ok) {
        f.padding = true;
        if (fault) *fault = f;
        return err(XPACK_E_OBJECT_CHECKSUM,
                   "{}: object of layer {} (row {}), expert {}: the padding after its payload is not zero", path_,
                   f.block, f.layer_slot, f.expert);
      }
      if (fault) *fault = f;
      return err(XPACK_E_OBJECT_CHECKSUM, "{}: object of layer {} (row {}), expert {} is damaged{}", path_,
                 f.block, f.layer_slot, f.expert,
                 f.role >= 0 ? fmt::format(" in role '{}'", idx_.roles[f.role].name)
                             : std::string(" (between roles)"));
    }
    if (progress) progress(first + count, n_obj, ctx);
  }
  if (!trunk_path_.empty()) XPACK_TRY(verify_trunk(trunk_path_));
  return {};
}

Status check_identity(const Index& idx, const std::string& gguf_path) {
  auto f = gguf::File::open(gguf_path);
  if (!f.ok())
    return err(f.error().code, "identity check: cannot read '{}' as GGUF: {}", gguf_path, f.error().message);
  const gguf::File& g = *f;
  std::string want = to_hex(idx.source_identity);
  if (const gguf::Value* v = g.find(kTrunkIdentityKey)) {
    if (v->type != gguf::ValueType::STRING || v->str != want)
      return err(XPACK_E_IDENTITY, "{}: trunk belongs to source {} but the pack was built from {}", gguf_path,
                 v->type == gguf::ValueType::STRING ? v->str : std::string("(not a string)"), want);
    auto ver = g.get_uint(kTrunkFormatKey);
    if (!ver.ok() || *ver != kVersion)
      return err(XPACK_E_IDENTITY, "{}: trunk has no/another {} (pack format {})", gguf_path, kTrunkFormatKey,
                 kVersion);
    return {};
  }
  // Not a trunk: accept one of the original source shards.
  XPACK_ASSIGN_OR_RETURN(ShardIdentity s, shard_identity(g.fd(), g.data_offset(), g.file_size(),
                                                         g.tensors().size(), gguf_path));
  for (const ShardIdentity& o : idx.shards)
    if (o.metadata_sha256 == s.metadata_sha256 && o.metadata_bytes == s.metadata_bytes &&
        o.file_size == s.file_size && o.tensor_count == s.tensor_count)
      return {};
  return err(XPACK_E_IDENTITY, "{}: neither the trunk of this pack (no {} key) nor one of its source files "
             "(metadata SHA-256 {} not in the pack's shard table)", gguf_path, kTrunkIdentityKey,
             to_hex(s.metadata_sha256));
}

}  // namespace xpack::pack
