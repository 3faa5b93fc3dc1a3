#include "pack_roles.h"

#include "weights.h"
#include "xpack/xpack.h"

namespace xrun {

std::vector<PackRole> pack_roles(xpack_pack* pack, const std::string& pack_path) {
  xpack_pack_info info{};
  info.size = sizeof(info);
  if (xpack_pack_get_info(pack, &info) != 0) throw ModelError("expert pack " + pack_path + ": no pack info");
  std::vector<PackRole> roles;
  for (uint32_t r = 0; r < info.n_roles; ++r) {
    xpack_role_info ri{};
    ri.size = sizeof(ri);
    if (xpack_pack_role_info(pack, r, &ri) != 0 || ri.offset + ri.nbytes > info.object_bytes) {
      throw ModelError("expert pack " + pack_path + ": bad role table");
    }
    const int64_t ne1 = static_cast<int64_t>(ri.n_dims >= 2 ? ri.ne[1] * (ri.n_dims >= 3 ? ri.ne[2] : 1) : 1);
    PackRole role;
    role.name = ri.name;
    role.matrix = borrowed_tensor(ri.type, static_cast<int64_t>(ri.ne[0]), ne1, nullptr);
    role.offset = ri.offset;
    roles.push_back(std::move(role));
  }
  return roles;
}

void object_views(const std::vector<PackRole>& roles, const void* object, int expert, ExpertWeights& out) {
  out.expert = expert;
  out.roles.clear();
  for (const PackRole& r : roles) {
    Tensor m = r.matrix;
    m.data = const_cast<uint8_t*>(static_cast<const uint8_t*>(object)) + r.offset;
    out.roles.emplace_back(r.name, m);
  }
}

}  // namespace xrun
