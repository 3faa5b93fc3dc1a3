// Encoding and decoding of the Expert Pack header + index (doc/pack-format.md).
#include "pack/format.h"

#include <algorithm>
#include <cstring>

#include <xxhash.h>
#if XPACK_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#include "common/checked_math.h"
#include "gguf/ggml_type.h"
#include "pack/identity.h"

namespace xpack::pack {

namespace {

// Header field offsets (doc/pack-format.md, "Header").
enum HeaderField : size_t {
  kOffMagic = 0,
  kOffVersion = 8,
  kOffHeaderBytes = 12,
  kOffFileSize = 16,
  kOffDataStart = 24,
  kOffStride = 32,
  kOffObjectBytes = 40,
  kOffAlignment = 48,
  kOffNLayers = 52,
  kOffNExperts = 56,
  kOffNExpertsUsed = 60,
  kOffNRoles = 64,
  kOffNShards = 68,
  kOffRoleEntryBytes = 72,
  kOffShardEntryBytes = 76,
  kOffChecksumAlgo = 80,
  kOffFlags = 84,
  kOffLayerTable = 88,
  kOffRoleTable = 96,
  kOffShardTable = 104,
  kOffChecksumTable = 112,
  kOffIndexEnd = 120,
  kOffArch = 128,
  kOffIdentity = 192,
  kOffIndexChecksum = 224,
  kOffReserved = 232,
  kOffHeaderChecksum = 248,
};

// Role entry field offsets.
enum RoleField : size_t {
  kRoleName = 0,
  kRoleType = 16,
  kRoleNDims = 20,
  kRoleNe = 24,
  kRoleOffset = 48,
  kRoleNbytes = 56,
  kRoleSrcNDims = 64,
  kRoleReserved0 = 68,
  kRoleSrcNe = 72,
  kRolePattern = 104,
  kRoleReserved = 200,
};

enum ShardField : size_t {
  kShardSha = 0,
  kShardMetaBytes = 32,
  kShardFileSize = 40,
  kShardTensors = 48,
  kShardReserved = 56,
};

void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t get64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

// A NUL-padded string field: must contain a NUL, and only zeros after it.
Result<std::string> get_cstr(const uint8_t* p, size_t n, const std::string& what) {
  const void* nul = std::memchr(p, 0, n);
  if (!nul) return err(XPACK_E_FORMAT, "{} is not NUL-terminated", what);
  size_t len = static_cast<const uint8_t*>(nul) - p;
  if (!all_zero(p + len, n - len)) return err(XPACK_E_FORMAT, "{} has bytes after its NUL", what);
  return std::string(reinterpret_cast<const char*>(p), len);
}

Status put_cstr(uint8_t* p, size_t n, const std::string& s, const char* what) {
  if (s.size() >= n || s.find('\0') != std::string::npos)
    return err(XPACK_E_LIMIT, "{} '{}' does not fit in {} bytes", what, s, n - 1);
  std::memcpy(p, s.data(), s.size());
  return {};
}

bool valid_role_name(const std::string& s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

uint64_t xxh3(const void* data, size_t n) {
#if XPACK_XXH_DISPATCH
  return XXH3_64bits_dispatch(data, n);
#else
  return XXH3_64bits(data, n);
#endif
}

std::string Role::source_name(uint32_t block) const {
  std::string s = source_pattern;
  size_t at = s.find(kBlockToken);
  if (at != std::string::npos) s.replace(at, std::strlen(kBlockToken), std::to_string(block));
  return s;
}

Result<IndexLayout> index_layout(uint64_t n_layers, uint64_t n_experts, uint64_t n_roles,
                                 uint64_t n_shards) {
  if (n_layers > kMaxLayers) return err(XPACK_E_LIMIT, "{} layers (limit {})", n_layers, kMaxLayers);
  if (n_experts > kMaxExperts) return err(XPACK_E_LIMIT, "{} experts (limit {})", n_experts, kMaxExperts);
  if (n_roles > kMaxRoles) return err(XPACK_E_LIMIT, "{} roles (limit {})", n_roles, kMaxRoles);
  if (n_shards > kMaxShards) return err(XPACK_E_LIMIT, "{} shards (limit {})", n_shards, kMaxShards);
  uint64_t n_objects = n_layers * n_experts;  // cannot overflow after the limits above
  if (n_objects > kMaxObjects) return err(XPACK_E_LIMIT, "{} objects (limit {})", n_objects, kMaxObjects);
  IndexLayout l;
  l.layer_table = kHeaderBytes;
  l.role_table = align_up(l.layer_table + 4 * n_layers, 8);
  l.shard_table = l.role_table + kRoleEntryBytes * n_roles;
  l.checksum_table = l.shard_table + kShardEntryBytes * n_shards;
  l.index_end = l.checksum_table + 8 * n_objects * (1 + n_roles);
  l.data_start = align_up(l.index_end, kAlignment);
  if (l.data_start > kMaxDataStart)
    return err(XPACK_E_LIMIT, "index of {} bytes (limit {})", l.data_start, kMaxDataStart);
  return l;
}

uint64_t checksum_row_offset(const IndexLayout& layout, uint64_t object, uint32_t n_roles) {
  return layout.checksum_table + object * 8 * (1 + uint64_t(n_roles));
}

uint64_t place_roles(std::vector<Role>& roles) {
  uint64_t cursor = 0;
  for (Role& r : roles) {
    r.offset = align_up(cursor, kRoleAlignment);
    cursor = r.offset + r.nbytes;
  }
  return cursor;
}

Result<std::vector<uint8_t>> encode_index(const Index& idx) {
  XPACK_ASSIGN_OR_RETURN(IndexLayout l, index_layout(idx.n_layers(), idx.n_experts, idx.n_roles(),
                                                      idx.shards.size()));
  if (idx.data_start != l.data_start)
    return err(XPACK_E_INTERNAL, "data_start {} != layout {}", idx.data_start, l.data_start);
  if (idx.checksums.size() != idx.n_objects() * (1 + idx.roles.size()))
    return err(XPACK_E_INTERNAL, "checksum table has {} entries", idx.checksums.size());
  std::vector<uint8_t> b(l.data_start, 0);
  uint8_t* h = b.data();
  std::memcpy(h + kOffMagic, kMagic, sizeof kMagic);
  put32(h + kOffVersion, idx.version);
  put32(h + kOffHeaderBytes, kHeaderBytes);
  put64(h + kOffFileSize, idx.file_size);
  put64(h + kOffDataStart, idx.data_start);
  put64(h + kOffStride, idx.object_stride);
  put64(h + kOffObjectBytes, idx.object_bytes);
  put32(h + kOffAlignment, idx.alignment);
  put32(h + kOffNLayers, idx.n_layers());
  put32(h + kOffNExperts, idx.n_experts);
  put32(h + kOffNExpertsUsed, idx.n_experts_used);
  put32(h + kOffNRoles, idx.n_roles());
  put32(h + kOffNShards, static_cast<uint32_t>(idx.shards.size()));
  put32(h + kOffRoleEntryBytes, kRoleEntryBytes);
  put32(h + kOffShardEntryBytes, kShardEntryBytes);
  put32(h + kOffChecksumAlgo, kChecksumXxh3_64);
  put32(h + kOffFlags, idx.flags);
  put64(h + kOffLayerTable, l.layer_table);
  put64(h + kOffRoleTable, l.role_table);
  put64(h + kOffShardTable, l.shard_table);
  put64(h + kOffChecksumTable, l.checksum_table);
  put64(h + kOffIndexEnd, l.index_end);
  XPACK_TRY(put_cstr(h + kOffArch, kArchBytes, idx.arch, "architecture"));
  std::memcpy(h + kOffIdentity, idx.source_identity.data(), 32);

  for (size_t i = 0; i < idx.layer_blocks.size(); ++i) put32(h + l.layer_table + 4 * i, idx.layer_blocks[i]);
  for (size_t i = 0; i < idx.roles.size(); ++i) {
    const Role& r = idx.roles[i];
    uint8_t* e = h + l.role_table + kRoleEntryBytes * i;
    XPACK_TRY(put_cstr(e + kRoleName, kRoleNameBytes, r.name, "role name"));
    put32(e + kRoleType, r.type);
    put32(e + kRoleNDims, r.n_dims);
    for (int d = 0; d < 3; ++d) put64(e + kRoleNe + 8 * d, r.ne[d]);
    put64(e + kRoleOffset, r.offset);
    put64(e + kRoleNbytes, r.nbytes);
    put32(e + kRoleSrcNDims, r.source_n_dims);
    for (int d = 0; d < 4; ++d) put64(e + kRoleSrcNe + 8 * d, r.source_ne[d]);
    XPACK_TRY(put_cstr(e + kRolePattern, kSourcePatternBytes, r.source_pattern, "source pattern"));
  }
  for (size_t i = 0; i < idx.shards.size(); ++i) {
    const ShardIdentity& s = idx.shards[i];
    uint8_t* e = h + l.shard_table + kShardEntryBytes * i;
    std::memcpy(e + kShardSha, s.metadata_sha256.data(), 32);
    put64(e + kShardMetaBytes, s.metadata_bytes);
    put64(e + kShardFileSize, s.file_size);
    put64(e + kShardTensors, s.tensor_count);
  }
  for (size_t i = 0; i < idx.checksums.size(); ++i) put64(h + l.checksum_table + 8 * i, idx.checksums[i]);

  put64(h + kOffIndexChecksum, xxh3(h + kHeaderBytes, l.data_start - kHeaderBytes));
  put64(h + kOffHeaderChecksum, xxh3(h, kOffHeaderChecksum));
  return b;
}

Result<Index> decode_index(IndexSource& src, uint64_t actual, const std::string& name,
                           bool check_index_checksum) {
  uint8_t h[kHeaderBytes];
  if (actual < sizeof kMagic) return err(XPACK_E_TRUNCATED, "{}: {} bytes is too small for an Expert Pack", name, actual);
  XPACK_TRY(src.read(0, h, sizeof kMagic));
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    // The usual mistake: the model itself given where its converted pack belongs.
    if (std::memcmp(h, "GGUF", 4) == 0)
      return err(XPACK_E_BAD_MAGIC,
                 "{}: is a GGUF model, not an Expert Pack; convert it first: xpack-build {} -o PREFIX "
                 "(writes PREFIX.xpack and PREFIX.trunk.gguf)",
                 name, name);
    return err(XPACK_E_BAD_MAGIC, "{}: not an Expert Pack (bad magic)", name);
  }
  if (actual < kHeaderBytes)
    return err(XPACK_E_TRUNCATED, "{}: file of {} bytes ends inside the {}-byte header", name, actual, kHeaderBytes);
  XPACK_TRY(src.read(0, h, kHeaderBytes));
  uint32_t version = get32(h + kOffVersion);
  if (version != kVersion)
    return err(XPACK_E_VERSION, "{}: format version {} (this library reads version {})", name, version, kVersion);
  uint64_t hsum = xxh3(h, kOffHeaderChecksum);
  if (hsum != get64(h + kOffHeaderChecksum))
    return err(XPACK_E_CHECKSUM, "{}: header checksum mismatch (stored {:016x}, computed {:016x})", name,
               get64(h + kOffHeaderChecksum), hsum);
  if (get32(h + kOffHeaderBytes) != kHeaderBytes || get32(h + kOffRoleEntryBytes) != kRoleEntryBytes ||
      get32(h + kOffShardEntryBytes) != kShardEntryBytes)
    return err(XPACK_E_FORMAT, "{}: unexpected header/entry sizes", name);
  if (get32(h + kOffChecksumAlgo) != kChecksumXxh3_64)
    return err(XPACK_E_UNSUPPORTED, "{}: checksum algorithm {}", name, get32(h + kOffChecksumAlgo));
  if (get32(h + kOffFlags) != 0) return err(XPACK_E_UNSUPPORTED, "{}: unknown flags {:#x}", name, get32(h + kOffFlags));
  if (!all_zero(h + kOffReserved, kOffHeaderChecksum - kOffReserved))
    return err(XPACK_E_FORMAT, "{}: reserved header bytes are not zero", name);

  Index idx;
  idx.version = version;
  idx.file_size = get64(h + kOffFileSize);
  idx.data_start = get64(h + kOffDataStart);
  idx.object_stride = get64(h + kOffStride);
  idx.object_bytes = get64(h + kOffObjectBytes);
  idx.alignment = get32(h + kOffAlignment);
  uint32_t n_layers = get32(h + kOffNLayers);
  idx.n_experts = get32(h + kOffNExperts);
  idx.n_experts_used = get32(h + kOffNExpertsUsed);
  uint32_t n_roles = get32(h + kOffNRoles);
  uint32_t n_shards = get32(h + kOffNShards);
  XPACK_ASSIGN_OR_RETURN(idx.arch, get_cstr(h + kOffArch, kArchBytes, name + ": architecture"));
  std::memcpy(idx.source_identity.data(), h + kOffIdentity, 32);

  if (idx.alignment != kAlignment)
    return err(XPACK_E_MISALIGNED, "{}: alignment {} (format v1 requires {})", name, idx.alignment, kAlignment);
  if (n_layers == 0 || idx.n_experts == 0 || n_roles == 0 || n_shards == 0)
    return err(XPACK_E_FORMAT, "{}: empty pack ({} layers, {} experts, {} roles, {} shards)", name, n_layers,
               idx.n_experts, n_roles, n_shards);
  auto layout_r = index_layout(n_layers, idx.n_experts, n_roles, n_shards);
  if (!layout_r.ok()) return err(layout_r.error().code, "{}: {}", name, layout_r.error().message);
  const IndexLayout& l = *layout_r;
  if (idx.n_experts_used > idx.n_experts)
    return err(XPACK_E_FORMAT, "{}: top-k {} exceeds {} experts", name, idx.n_experts_used, idx.n_experts);
  if (get64(h + kOffLayerTable) != l.layer_table || get64(h + kOffRoleTable) != l.role_table ||
      get64(h + kOffShardTable) != l.shard_table || get64(h + kOffChecksumTable) != l.checksum_table ||
      get64(h + kOffIndexEnd) != l.index_end)
    return err(XPACK_E_FORMAT, "{}: index table offsets disagree with the counts", name);
  if (!is_aligned(idx.data_start, kAlignment))
    return err(XPACK_E_MISALIGNED, "{}: data_start {} is not a multiple of {}", name, idx.data_start, kAlignment);
  if (idx.data_start != l.data_start)
    return err(XPACK_E_FORMAT, "{}: data_start {} but the index ends at {} (expected {})", name, idx.data_start,
               l.index_end, l.data_start);
  if (idx.object_stride == 0 || !is_aligned(idx.object_stride, kAlignment))
    return err(XPACK_E_MISALIGNED, "{}: object stride {} is not a positive multiple of {}", name,
               idx.object_stride, kAlignment);
  if (idx.object_bytes == 0 || idx.object_bytes > idx.object_stride)
    return err(XPACK_E_FORMAT, "{}: object payload {} bytes does not fit the stride {}", name, idx.object_bytes,
               idx.object_stride);
  auto payload = checked_mul(uint64_t(n_layers) * idx.n_experts, idx.object_stride);
  auto expected = payload ? checked_add(*payload, idx.data_start) : std::nullopt;
  if (!expected) return err(XPACK_E_LIMIT, "{}: pack size overflows", name);
  if (idx.file_size != *expected)
    return err(XPACK_E_FORMAT, "{}: header says {} bytes but data_start + objects x stride = {}", name,
               idx.file_size, *expected);
  if (actual < idx.data_start)
    return err(XPACK_E_TRUNCATED, "{}: file of {} bytes ends inside the index ({} bytes)", name, actual,
               idx.data_start);

  std::vector<uint8_t> buf(idx.data_start);
  std::memcpy(buf.data(), h, kHeaderBytes);
  XPACK_TRY(src.read(kHeaderBytes, buf.data() + kHeaderBytes, idx.data_start - kHeaderBytes));
  uint64_t isum = xxh3(buf.data() + kHeaderBytes, idx.data_start - kHeaderBytes);
  if (check_index_checksum && isum != get64(h + kOffIndexChecksum))
    return err(XPACK_E_CHECKSUM, "{}: index checksum mismatch (stored {:016x}, computed {:016x})", name,
               get64(h + kOffIndexChecksum), isum);
  const uint8_t* b = buf.data();
  if (!all_zero(b + l.index_end, idx.data_start - l.index_end))
    return err(XPACK_E_FORMAT, "{}: padding before data_start is not zero", name);

  // Layer table: strictly increasing block indices.
  idx.layer_blocks.resize(n_layers);
  for (uint32_t i = 0; i < n_layers; ++i) {
    idx.layer_blocks[i] = get32(b + l.layer_table + 4 * i);
    if (i > 0 && idx.layer_blocks[i] <= idx.layer_blocks[i - 1])
      return err(XPACK_E_FORMAT, "{}: layer table is not strictly increasing at row {}", name, i);
  }
  if (!all_zero(b + l.layer_table + 4 * n_layers, l.role_table - l.layer_table - 4 * n_layers))
    return err(XPACK_E_FORMAT, "{}: layer table padding is not zero", name);

  // Role table: known types, consistent sizes, ascending aligned non-overlapping offsets.
  uint64_t cursor = 0;
  for (uint32_t i = 0; i < n_roles; ++i) {
    const uint8_t* e = b + l.role_table + kRoleEntryBytes * i;
    Role r;
    std::string what = fmt::format("{}: role {}", name, i);
    XPACK_ASSIGN_OR_RETURN(r.name, get_cstr(e + kRoleName, kRoleNameBytes, what + " name"));
    if (!valid_role_name(r.name)) return err(XPACK_E_FORMAT, "{} has an invalid name", what);
    for (const Role& o : idx.roles)
      if (o.name == r.name) return err(XPACK_E_DUPLICATE, "{}: role '{}' appears twice", name, r.name);
    r.type = get32(e + kRoleType);
    if (!gguf::type_info(r.type))
      return err(XPACK_E_UNKNOWN_TYPE, "{} ('{}') has unknown ggml type {}", what, r.name, r.type);
    r.n_dims = get32(e + kRoleNDims);
    if (r.n_dims < 1 || r.n_dims > 3) return err(XPACK_E_FORMAT, "{} has {} dims", what, r.n_dims);
    for (int d = 0; d < 3; ++d) {
      r.ne[d] = get64(e + kRoleNe + 8 * d);
      if (r.ne[d] == 0 || (d >= int(r.n_dims) && r.ne[d] != 1))
        return err(XPACK_E_FORMAT, "{} has a bad shape", what);
    }
    r.offset = get64(e + kRoleOffset);
    r.nbytes = get64(e + kRoleNbytes);
    auto nb = gguf::tensor_nbytes(r.type, r.ne.data(), r.n_dims, r.name);
    if (!nb.ok()) return err(nb.error().code, "{}: {}", what, nb.error().message);
    if (*nb != r.nbytes)
      return err(XPACK_E_FORMAT, "{} ('{}') says {} bytes but its shape and type give {}", what, r.name, r.nbytes,
                 *nb);
    if (!is_aligned(r.offset, kRoleAlignment))
      return err(XPACK_E_MISALIGNED, "{} ('{}') offset {} is not a multiple of {}", what, r.name, r.offset,
                 kRoleAlignment);
    if (r.offset < cursor)
      return err(XPACK_E_OVERLAP, "{} ('{}') at {} overlaps the role before it", what, r.name, r.offset);
    auto end = checked_add(r.offset, r.nbytes);
    if (!end || *end > idx.object_bytes)
      return err(XPACK_E_FORMAT, "{} ('{}') ends past the object payload ({} bytes)", what, r.name,
                 idx.object_bytes);
    cursor = *end;
    r.source_n_dims = get32(e + kRoleSrcNDims);
    if (r.source_n_dims != r.n_dims + 1 || get32(e + kRoleReserved0) != 0)
      return err(XPACK_E_FORMAT, "{} has a bad source dims count", what);
    for (int d = 0; d < 4; ++d) r.source_ne[d] = get64(e + kRoleSrcNe + 8 * d);
    for (uint32_t d = 0; d < r.n_dims; ++d)
      if (r.source_ne[d] != r.ne[d]) return err(XPACK_E_FORMAT, "{}: source shape disagrees with slice shape", what);
    if (r.source_ne[r.n_dims] != idx.n_experts)
      return err(XPACK_E_FORMAT, "{}: source expert dim {} != {} experts", what, r.source_ne[r.n_dims],
                 idx.n_experts);
    XPACK_ASSIGN_OR_RETURN(r.source_pattern, get_cstr(e + kRolePattern, kSourcePatternBytes, what + " source pattern"));
    if (r.source_pattern.find(kBlockToken) == std::string::npos)
      return err(XPACK_E_FORMAT, "{}: source pattern '{}' lacks {}", what, r.source_pattern, kBlockToken);
    if (!all_zero(e + kRoleReserved, kRoleEntryBytes - kRoleReserved))
      return err(XPACK_E_FORMAT, "{}: reserved bytes are not zero", what);
    idx.roles.push_back(std::move(r));
  }
  if (cursor != idx.object_bytes)
    return err(XPACK_E_FORMAT, "{}: roles end at {} but the object payload is {} bytes", name, cursor,
               idx.object_bytes);

  for (uint32_t i = 0; i < n_shards; ++i) {
    const uint8_t* e = b + l.shard_table + kShardEntryBytes * i;
    ShardIdentity s;
    std::memcpy(s.metadata_sha256.data(), e + kShardSha, 32);
    s.metadata_bytes = get64(e + kShardMetaBytes);
    s.file_size = get64(e + kShardFileSize);
    s.tensor_count = get64(e + kShardTensors);
    if (get64(e + kShardReserved) != 0 || s.metadata_bytes > s.file_size)
      return err(XPACK_E_FORMAT, "{}: shard entry {} is inconsistent", name, i);
    idx.shards.push_back(s);
  }
  if (combine_identity(idx.shards) != idx.source_identity)
    return err(XPACK_E_FORMAT, "{}: source identity does not match the shard table", name);

  uint64_t n_sums = idx.n_objects() * (1 + n_roles);
  idx.checksums.resize(n_sums);
  std::memcpy(idx.checksums.data(), b + l.checksum_table, 8 * n_sums);

  if (actual != idx.file_size)
    return err(XPACK_E_SIZE_MISMATCH, "{}: file is {} bytes but the header implies {} ({} objects x stride {} + {})",
               name, actual, idx.file_size, idx.n_objects(), idx.object_stride, idx.data_start);
  return idx;
}

}  // namespace xpack::pack
