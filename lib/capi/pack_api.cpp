// The xpack_pack_* C API: an exception-free shell over pack::PackReader.
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include "capi/sized_struct.h"
#include "common/handle_message.h"
#include "common/result.h"
#include "pack/pack_reader.h"
#include "xpack/xpack.h"

struct xpack_pack {
  xpack::pack::PackReader reader;
  // Accessors take a const handle and may fail concurrently: one message per thread.
  xpack::HandleMessage errmsg;
};

namespace {

using xpack::pack::PackReader;

int fail(const xpack_pack* p, int code, std::string msg) {
  return xpack::record_failure(p ? &p->errmsg : nullptr, code, std::move(msg));
}

int fail(const xpack_pack* p, const xpack::Error& e) { return fail(p, e.code, e.message); }

int check_slot(const xpack_pack* p, uint32_t layer_slot, uint32_t expert) {
  if (!p) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack: NULL handle");
  if (!p->reader.valid_object(layer_slot, expert))
    return fail(p, XPACK_E_INVALID_ARG,
                fmt::format("object (layer slot {}, expert {}) out of range ({} layers x {} experts)", layer_slot,
                            expert, p->reader.n_layers(), p->reader.n_experts()));
  return 0;
}

}  // namespace

extern "C" {

XPACK_API int xpack_pack_open(const char* path, const xpack_pack_options* opts, xpack_pack** out) {
  if (out) *out = nullptr;
  if (!path || !out) return fail(nullptr, XPACK_E_INVALID_ARG, "xpack_pack_open: NULL path or out");
  xpack::pack::OpenOptions o;
  if (opts) {
    if (!xpack::capi::sized_struct_ok(opts))
      return fail(nullptr, XPACK_E_INVALID_ARG, "xpack_pack_open: options.size is too small");
    xpack_pack_options given{};
    xpack::capi::merge_sized_options(&given, *opts);
    if (given.trunk_path) o.trunk_path = given.trunk_path;
  }
  auto r = PackReader::open(path, o);
  if (!r.ok()) return fail(nullptr, r.error());
  auto* p = new (std::nothrow) xpack_pack{std::move(r).value(), {}};
  if (!p) return fail(nullptr, -ENOMEM, "xpack_pack_open: out of memory");
  *out = p;
  return 0;
}

XPACK_API void xpack_pack_close(xpack_pack* p) { delete p; }

XPACK_API const char* xpack_pack_errmsg(const xpack_pack* p) { return p ? p->errmsg.get() : ""; }

XPACK_API int xpack_pack_validate(xpack_pack* p, int level, xpack_pack_fault* fault) {
  if (!p) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_validate: NULL handle");
  if (level != XPACK_VALIDATE_STRUCTURE && level != XPACK_VALIDATE_CHECKSUMS)
    return fail(p, XPACK_E_INVALID_ARG, fmt::format("xpack_pack_validate: unknown level {}", level));
  if (fault && !xpack::capi::sized_struct_ok(fault))
    return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_validate: fault.size is too small");
  xpack::pack::Fault f;
  auto s = p->reader.validate(level == XPACK_VALIDATE_CHECKSUMS ? xpack::pack::ValidateLevel::kChecksums
                                                                 : xpack::pack::ValidateLevel::kStructure,
                              &f);
  if (!s.ok()) {
    if (fault && s.error().code == XPACK_E_OBJECT_CHECKSUM) {
      xpack_pack_fault full{};
      full.size = sizeof(full);
      full.layer = f.block;
      full.expert = f.expert;
      full.role = f.role;
      xpack::capi::copy_sized_out(fault, full);
    }
    return fail(p, s.error());
  }
  return 0;
}

XPACK_API const char* xpack_pack_path(const xpack_pack* p) { return p ? p->reader.path().c_str() : ""; }

XPACK_API int xpack_pack_get_info(const xpack_pack* p, xpack_pack_info* out) {
  if (!p || !out) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_get_info: NULL argument");
  if (!xpack::capi::sized_struct_ok(out)) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_get_info: info.size is too small");
  const PackReader& r = p->reader;
  xpack_pack_info i{};
  i.size = sizeof(i);
  i.version = r.version();
  i.arch = r.arch().c_str();
  i.n_layers = r.n_layers();
  i.n_experts = r.n_experts();
  i.n_experts_used = r.n_experts_used();
  i.n_roles = static_cast<uint32_t>(r.roles().size());
  i.alignment = r.alignment();
  i.data_start = r.data_start();
  i.object_stride = r.object_stride();
  i.object_bytes = r.object_bytes();
  i.file_size = r.file_size();
  std::memcpy(i.source_sha256, r.source_identity().data(), sizeof i.source_sha256);
  xpack::capi::copy_sized_out(out, i);
  return 0;
}

XPACK_API int xpack_pack_layer_block(const xpack_pack* p, uint32_t layer_slot, uint32_t* block) {
  if (!p || !block) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_layer_block: NULL argument");
  if (layer_slot >= p->reader.n_layers())
    return fail(p, XPACK_E_INVALID_ARG,
                fmt::format("layer slot {} out of range ({} layers)", layer_slot, p->reader.n_layers()));
  *block = p->reader.layer_blocks()[layer_slot];
  return 0;
}

XPACK_API int xpack_pack_layer_slot(const xpack_pack* p, uint32_t block, uint32_t* layer_slot) {
  if (!p || !layer_slot) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_layer_slot: NULL argument");
  auto s = p->reader.layer_slot(block);
  if (!s) return fail(p, XPACK_E_NOT_FOUND, fmt::format("block {} has no routed experts in this pack", block));
  *layer_slot = *s;
  return 0;
}

XPACK_API int xpack_pack_role_info(const xpack_pack* p, uint32_t role, xpack_role_info* out) {
  if (!p || !out) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_role_info: NULL argument");
  if (!xpack::capi::sized_struct_ok(out)) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_role_info: info.size is too small");
  if (role >= p->reader.roles().size())
    return fail(p, XPACK_E_INVALID_ARG, fmt::format("role {} out of range ({} roles)", role, p->reader.roles().size()));
  const auto& r = p->reader.roles()[role];
  xpack_role_info i{};
  i.size = sizeof(i);
  i.name = r.name.c_str();
  i.type = r.type;
  i.n_dims = r.n_dims;
  for (int d = 0; d < 3; ++d) i.ne[d] = r.ne[d];
  i.offset = r.offset;
  i.nbytes = r.nbytes;
  xpack::capi::copy_sized_out(out, i);
  return 0;
}

XPACK_API int xpack_pack_find_role(const xpack_pack* p, const char* name) {
  if (!p || !name) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_find_role: NULL argument");
  int i = p->reader.find_role(name);
  if (i < 0) return fail(p, XPACK_E_NOT_FOUND, fmt::format("no role '{}' in this pack", name));
  return i;
}

XPACK_API int xpack_pack_role_source(const xpack_pack* p, uint32_t role, uint32_t block, char* buf,
                                     size_t buf_size) {
  if (!p || !buf) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_role_source: NULL argument");
  if (role >= p->reader.roles().size())
    return fail(p, XPACK_E_INVALID_ARG, fmt::format("role {} out of range ({} roles)", role, p->reader.roles().size()));
  if (!p->reader.layer_slot(block))
    return fail(p, XPACK_E_NOT_FOUND, fmt::format("block {} has no routed experts in this pack", block));
  std::string name = p->reader.roles()[role].source_name(block);
  if (name.size() + 1 > buf_size)
    return fail(p, XPACK_E_LIMIT, fmt::format("buffer of {} bytes is too small for '{}'", buf_size, name));
  std::memcpy(buf, name.c_str(), name.size() + 1);
  return 0;
}

XPACK_API int xpack_pack_object_offset(const xpack_pack* p, uint32_t layer_slot, uint32_t expert, uint64_t* offset) {
  if (int rc = check_slot(p, layer_slot, expert)) return rc;
  if (!offset) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_object_offset: NULL offset");
  *offset = p->reader.object_offset(layer_slot, expert);
  return 0;
}

XPACK_API int xpack_pack_object_checksum(const xpack_pack* p, uint32_t layer_slot, uint32_t expert, uint64_t* xxh3) {
  if (int rc = check_slot(p, layer_slot, expert)) return rc;
  if (!xxh3) return fail(p, XPACK_E_INVALID_ARG, "xpack_pack_object_checksum: NULL out");
  *xxh3 = p->reader.object_checksum(layer_slot, expert);
  return 0;
}

XPACK_API int xpack_pack_read_object(xpack_pack* p, uint32_t layer_slot, uint32_t expert, void* buf,
                                     size_t buf_size, int verify) {
  if (int rc = check_slot(p, layer_slot, expert)) return rc;
  auto s = p->reader.read_object(layer_slot, expert, buf, buf_size, verify != 0);
  if (!s.ok()) return fail(p, s.error());
  return 0;
}

}  // extern "C"
