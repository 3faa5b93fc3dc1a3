#include "pack/plan.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "common/checked_math.h"
#include "gguf/ggml_type.h"
#include "pack/identity.h"

namespace xpack::pack {

namespace {

// Object order of roles: the order a SwiGLU expert uses them.
constexpr const char* kRoleOrder[] = {"gate", "up", "gate_up", "down"};

std::string shape_str(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

const char* type_name(uint32_t type) {
  const gguf::TypeInfo* ti = gguf::type_info(type);
  return ti ? ti->name : "?";
}

struct Found {
  const gguf::TensorInfo* info;
  uint32_t shard;
};

}  // namespace

std::optional<ExpertTensorName> parse_expert_tensor_name(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.", kMid = ".ffn_", kSuffix = "_exps.weight";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  name.remove_suffix(kSuffix.size());
  size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9) return std::nullopt;
  std::string_view num = name.substr(0, dot);
  if (num.size() > 1 && num[0] == '0') return std::nullopt;  // one spelling per block
  uint32_t block = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), block);
  if (ec != std::errc() || p != num.data() + num.size()) return std::nullopt;
  std::string_view rest = name.substr(dot);
  if (!rest.starts_with(kMid)) return std::nullopt;
  rest.remove_prefix(kMid.size());
  for (const char* r : kRoleOrder)
    if (rest == r) return ExpertTensorName{block, std::string(r)};
  return std::nullopt;
}

Result<Plan> make_plan(const std::vector<const gguf::File*>& shards) {
  if (shards.empty() || !shards[0]) return err(XPACK_E_INVALID_ARG, "no source files");
  const gguf::File& meta = *shards[0];
  Plan plan;
  Index& idx = plan.index;
  auto arch = meta.get_string("general.architecture");
  idx.arch = arch.ok() ? arch.value() : std::string();
  if (idx.arch.size() >= kArchBytes)
    return err(XPACK_E_LIMIT, "{}: architecture name '{}' is longer than {} bytes", meta.path(), idx.arch,
               kArchBytes - 1);

  // block -> role -> tensor
  std::map<uint32_t, std::map<std::string, Found>> blocks;
  for (uint32_t s = 0; s < shards.size(); ++s) {
    for (const gguf::TensorInfo& t : shards[s]->tensors()) {
      auto name = parse_expert_tensor_name(t.name);
      if (!name) {
        gguf::TensorInfo ti = t;
        ti.shard = s;
        plan.trunk_tensors.push_back(std::move(ti));
        continue;
      }
      if (!blocks[name->block].emplace(name->role, Found{&t, s}).second)
        return err(XPACK_E_DUPLICATE, "tensor '{}' appears twice in the source", t.name);
    }
  }
  if (blocks.empty())
    return err(XPACK_E_NOT_FOUND,
               "{}: no routed expert tensors (blk.N.ffn_{{gate,up,down,gate_up}}_exps.weight): not a MoE model?",
               meta.path());
  if (blocks.size() > kMaxLayers) return err(XPACK_E_LIMIT, "{} MoE layers (limit {})", blocks.size(), kMaxLayers);

  // Roles come from the first MoE layer; every other layer must match it exactly.
  const auto& first = blocks.begin()->second;
  const uint32_t first_block = blocks.begin()->first;
  for (const char* rn : kRoleOrder) {
    auto it = first.find(rn);
    if (it == first.end()) continue;
    const gguf::TensorInfo& t = *it->second.info;
    if (t.n_dims < 2)
      return err(XPACK_E_FORMAT, "{}: expert tensor has {} dims (needs an expert dimension)", t.name, t.n_dims);
    Role r;
    r.name = rn;
    r.type = t.type;
    r.n_dims = t.n_dims - 1;
    for (uint32_t d = 0; d < r.n_dims; ++d) r.ne[d] = t.ne[d];
    r.source_n_dims = t.n_dims;
    r.source_ne = t.ne;
    r.source_pattern = std::string("blk.") + kBlockToken + ".ffn_" + rn + "_exps.weight";
    uint64_t n_exp = t.ne[t.n_dims - 1];
    if (idx.n_experts == 0) idx.n_experts = static_cast<uint32_t>(std::min<uint64_t>(n_exp, UINT32_MAX));
    if (n_exp != idx.n_experts)
      return err(XPACK_E_FORMAT, "{}: {} experts, but role '{}' of the same layer has {}", t.name, n_exp,
                 idx.roles.empty() ? "?" : idx.roles[0].name, idx.n_experts);
    if (n_exp > kMaxExperts) return err(XPACK_E_LIMIT, "{}: {} experts (limit {})", t.name, n_exp, kMaxExperts);
    XPACK_ASSIGN_OR_RETURN(r.nbytes, gguf::tensor_nbytes(r.type, r.ne.data(), r.n_dims, t.name));
    if (auto total = checked_mul(r.nbytes, n_exp); !total || *total != t.nbytes)
      return err(XPACK_E_FORMAT, "{}: {} bytes is not {} experts x {} bytes", t.name, t.nbytes, n_exp, r.nbytes);
    idx.roles.push_back(std::move(r));
  }
  for (const auto& [block, roles] : blocks) {
    if (roles.size() != idx.roles.size()) {
      std::string have, want;
      for (const auto& [n, f] : roles) have += (have.empty() ? "" : ",") + n;
      for (const Role& r : idx.roles) want += (want.empty() ? "" : ",") + r.name;
      return err(XPACK_E_UNSUPPORTED,
                 "layer {} has expert roles {{{}}} but layer {} has {{{}}}; format v1 needs the same roles in "
                 "every MoE layer", block, have, first_block, want);
    }
    for (const Role& r : idx.roles) {
      auto it = roles.find(r.name);
      if (it == roles.end())
        return err(XPACK_E_UNSUPPORTED, "layer {} lacks expert role '{}' that layer {} has", block, r.name,
                   first_block);
      const gguf::TensorInfo& t = *it->second.info;
      bool same = t.type == r.type && t.n_dims == r.source_n_dims && t.ne == r.source_ne;
      if (!same)
        return err(XPACK_E_UNSUPPORTED,
                   "{} is {} {} but layer {} has {} {}; format v1 needs identical expert types and shapes in "
                   "every MoE layer", t.name, type_name(t.type), shape_str(t), first_block, type_name(r.type),
                   shape_str(*first.at(r.name).info));
    }
    idx.layer_blocks.push_back(block);
  }

  auto used = meta.get_uint(idx.arch + ".expert_used_count");
  idx.n_experts_used = used.ok() && *used <= idx.n_experts ? static_cast<uint32_t>(*used) : 0;
  if (auto declared = meta.get_uint(idx.arch + ".expert_count"); declared.ok() && *declared != idx.n_experts)
    return err(XPACK_E_FORMAT, "{}: {}.expert_count is {} but the expert tensors hold {} experts", meta.path(),
               idx.arch, *declared, idx.n_experts);

  idx.object_bytes = place_roles(idx.roles);
  idx.object_stride = align_up(idx.object_bytes, kAlignment);
  for (uint32_t s = 0; s < shards.size(); ++s) {
    const gguf::File& f = *shards[s];
    XPACK_ASSIGN_OR_RETURN(ShardIdentity id, shard_identity(f.fd(), f.data_offset(), f.file_size(),
                                                            f.tensors().size(), f.path()));
    idx.shards.push_back(id);
  }
  idx.source_identity = combine_identity(idx.shards);
  XPACK_ASSIGN_OR_RETURN(plan.layout, index_layout(idx.n_layers(), idx.n_experts, idx.n_roles(), idx.shards.size()));
  idx.data_start = plan.layout.data_start;
  auto payload = checked_mul(idx.n_objects(), idx.object_stride);
  auto total = payload ? checked_add(*payload, idx.data_start) : std::nullopt;
  if (!total) return err(XPACK_E_LIMIT, "pack size overflows");
  idx.file_size = *total;
  idx.checksums.assign(idx.n_objects() * (1 + idx.roles.size()), 0);

  plan.shard_needed_until.assign(shards.size(), 0);
  for (uint32_t slot = 0; slot < idx.n_layers(); ++slot) {
    const auto& roles = blocks.at(idx.layer_blocks[slot]);
    for (const Role& r : idx.roles) {
      const Found& f = roles.at(r.name);
      plan.expert_sources.push_back(SourceRef{f.shard, f.info->file_offset, f.info->nbytes});
      plan.shard_needed_until[f.shard] = uint64_t(slot + 1) * idx.n_experts;
    }
  }
  return plan;
}

Result<std::vector<std::optional<SourceRef>>> locate_sources(const Index& idx,
                                                             const std::vector<const gguf::File*>& shards) {
  std::vector<std::optional<SourceRef>> out(size_t(idx.n_layers()) * idx.n_roles());
  for (uint32_t slot = 0; slot < idx.n_layers(); ++slot) {
    for (uint32_t ri = 0; ri < idx.n_roles(); ++ri) {
      const Role& r = idx.roles[ri];
      std::string name = r.source_name(idx.layer_blocks[slot]);
      for (uint32_t s = 0; s < shards.size(); ++s) {
        if (!shards[s]) continue;
        const gguf::TensorInfo* t = shards[s]->find_tensor(name);
        if (!t) continue;
        if (t->type != r.type || t->n_dims != r.source_n_dims || t->ne != r.source_ne ||
            t->nbytes != r.nbytes * idx.n_experts)
          return err(XPACK_E_IDENTITY, "{}: tensor '{}' differs from the pack's role '{}'", shards[s]->path(), name,
                     r.name);
        out[size_t(slot) * idx.n_roles() + ri] = SourceRef{s, t->file_offset, t->nbytes};
        break;
      }
    }
  }
  return out;
}

}  // namespace xpack::pack
