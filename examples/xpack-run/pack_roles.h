// The role table of an Expert Pack (which matrices one (layer, expert) object
// holds, at which offsets), shared by the two pack readers, and the weight
// views of one object's bytes.
#pragma once

#include <string>
#include <vector>

#include "experts.h"

struct xpack_pack;

namespace xrun {

// One role of every object: a matrix `offset` bytes into the object.
struct PackRole {
  std::string name;
  Tensor matrix;  // data unset: add the object's address
  uint64_t offset = 0;
};

// The pack's roles; throws ModelError (naming `pack_path`) for a role table
// that does not fit the objects. The pack stays open either way.
std::vector<PackRole> pack_roles(xpack_pack* pack, const std::string& pack_path);

// out = the views of the object at `object` (a backend address) as expert `expert`.
void object_views(const std::vector<PackRole>& roles, const void* object, int expert, ExpertWeights& out);

}  // namespace xrun
