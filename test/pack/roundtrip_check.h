// The round-trip property of xpack-build, checked independently of the builder:
// every (layer, expert, role) at its computed offset equals the source slice, the
// stride padding is zero, and the trunk holds exactly the non-expert tensors with
// identical bytes and the source metadata (minus split.*, plus the identity keys).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>

#include <doctest/doctest.h>

#include "gguf/gguf_model.h"
#include "pack/identity.h"
#include "pack/pack_reader.h"
#include "pack/plan.h"
#include "../gguf/gguf_test_util.h"  // same_value: bitwise metadata equality
#include "pack_test_util.h"

namespace xpack::test {

inline void check_round_trip(const fs::path& model_path, const fs::path& out) {
  INFO("model ", model_path.string());
  auto model_r = gguf::Model::open(model_path.string());
  REQUIRE_MESSAGE(model_r.ok(), model_r.error().message);
  const gguf::Model& model = *model_r;
  const std::string pack_path = out.string() + ".xpack", trunk_path = out.string() + ".trunk.gguf";
  auto pack_r = pack::PackReader::open(pack_path, pack::OpenOptions{trunk_path});
  REQUIRE_MESSAGE(pack_r.ok(), pack_r.error().message);
  const pack::PackReader& pk = *pack_r;

  // Expert tensors of the source, by block and role, found independently by name.
  std::map<uint32_t, std::map<std::string, const gguf::TensorInfo*>> experts;
  std::set<std::string> expert_names;
  for (const auto& t : model.tensors()) {
    auto n = pack::parse_expert_tensor_name(t.name);
    if (!n) continue;
    experts[n->block][n->role] = &t;
    expert_names.insert(t.name);
  }
  REQUIRE(!experts.empty());
  std::vector<uint32_t> blocks;
  for (const auto& [b, roles] : experts) blocks.push_back(b);
  CHECK(pk.layer_blocks() == blocks);
  CHECK(pk.arch() == model.arch());

  std::vector<uint8_t> obj(pk.object_stride());
  uint64_t checked_roles = 0;
  for (uint32_t slot = 0; slot < pk.n_layers(); ++slot) {
    const auto& roles = experts[pk.layer_blocks()[slot]];
    REQUIRE(roles.size() == pk.roles().size());
    for (uint32_t e = 0; e < pk.n_experts(); ++e) {
      uint64_t off = pk.index().data_start + (uint64_t(slot) * pk.n_experts() + e) * pk.object_stride();
      REQUIRE(off == pk.object_offset(slot, e));
      REQUIRE(off % 4096 == 0);
      REQUIRE(::pread(pk.fd(), obj.data(), obj.size(), off) == ssize_t(obj.size()));
      std::vector<bool> covered(obj.size(), false);
      for (const auto& role : pk.roles()) {
        const gguf::TensorInfo* t = roles.at(role.name);
        REQUIRE(t->type == role.type);
        REQUIRE(t->ne[t->n_dims - 1] == pk.n_experts());
        const uint64_t slice = t->nbytes / pk.n_experts();
        REQUIRE(slice == role.nbytes);
        auto src = model.tensor_data(*t);
        REQUIRE(src.ok());
        bool same = std::memcmp(obj.data() + role.offset, *src + e * slice, slice) == 0;
        CHECK_MESSAGE(same, "layer ", pk.layer_blocks()[slot], " expert ", e, " role ", role.name);
        for (uint64_t i = 0; i < slice; ++i) covered[role.offset + i] = true;
        ++checked_roles;
      }
      bool padding_zero = true;
      for (size_t i = 0; i < obj.size(); ++i)
        if (!covered[i] && obj[i] != 0) padding_zero = false;
      CHECK_MESSAGE(padding_zero, "padding of object (", slot, ", ", e, ") is not zero");
    }
  }
  CHECK(checked_roles == uint64_t(pk.n_layers()) * pk.n_experts() * pk.roles().size());

  // Trunk: non-expert tensors in source order with identical bytes.
  auto trunk_r = gguf::File::open(trunk_path);
  REQUIRE_MESSAGE(trunk_r.ok(), trunk_r.error().message);
  const gguf::File& trunk = *trunk_r;
  std::vector<std::string> want;
  for (const auto& t : model.tensors())
    if (!expert_names.count(t.name)) want.push_back(t.name);
  std::vector<std::string> have;
  for (const auto& t : trunk.tensors()) have.push_back(t.name);
  CHECK(have == want);
  std::vector<uint8_t> buf;
  for (const auto& t : trunk.tensors()) {
    const gguf::TensorInfo* s = model.find_tensor(t.name);
    REQUIRE(s);
    CHECK(s->type == t.type);
    CHECK(s->ne == t.ne);
    REQUIRE(s->nbytes == t.nbytes);
    buf.resize(t.nbytes);
    REQUIRE(::pread(trunk.fd(), buf.data(), t.nbytes, t.file_offset) == ssize_t(t.nbytes));
    auto src = model.tensor_data(*s);
    REQUIRE(src.ok());
    CHECK_MESSAGE(std::memcmp(buf.data(), *src, t.nbytes) == 0, "trunk tensor ", t.name);
  }
  // Trunk metadata: the source's (split.* dropped) in order, then the identity keys.
  std::vector<const gguf::KeyValue*> src_kvs;
  for (const auto& kv : model.meta().kvs())
    if (!kv.key.starts_with("split.")) src_kvs.push_back(&kv);
  REQUIRE(trunk.kvs().size() == src_kvs.size() + 3);
  for (size_t i = 0; i < src_kvs.size(); ++i) {
    CHECK(trunk.kvs()[i].key == src_kvs[i]->key);
    CHECK_MESSAGE(same_value(trunk.kvs()[i].value, src_kvs[i]->value), "key ", src_kvs[i]->key);
  }
  auto id = trunk.get_string(pack::kTrunkIdentityKey);
  REQUIRE(id.ok());
  CHECK(*id == pk.source_identity_hex());
  CHECK(trunk.get_uint(pack::kTrunkFormatKey).value() == 1);
  // One xxh3-64 per trunk tensor, of exactly its bytes.
  const gguf::Value* sums = trunk.find(pack::kTrunkChecksumsKey);
  REQUIRE(sums);
  REQUIRE(sums->array_size() == trunk.tensors().size());
  for (size_t i = 0; i < trunk.tensors().size(); ++i) {
    const gguf::TensorInfo& t = trunk.tensors()[i];
    buf.resize(t.nbytes);
    REQUIRE(::pread(trunk.fd(), buf.data(), t.nbytes, t.file_offset) == ssize_t(t.nbytes));
    CHECK_MESSAGE(sums->element(i).u == pack::xxh3(buf.data(), t.nbytes), "checksum of ", t.name);
  }
  CHECK(trunk.alignment() == model.meta().alignment());

  // And the stored checksums describe what is there.
  CHECK(pk.validate(pack::ValidateLevel::kChecksums).ok());
}

}  // namespace xpack::test
