// Writes the seed corpus (tiny valid inputs) for the fuzz targets:
//   gen-seed-corpus OUT_GGUF_DIR OUT_PACK_DIR
// The checked-in corpus under fuzz/corpus/ was made with it.
#include <cstdio>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "gguf/gguf_writer.h"
#include "pack/format.h"
#include "pack/identity.h"

namespace {

using namespace xpack;

bool save(const std::string& path, const std::vector<uint8_t>& b) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
  return std::fclose(f) == 0 && ok;
}

std::vector<uint8_t> gguf_file(int variant) {
  gguf::Writer w(variant == 2 ? 64 : 32);
  w.add_kv("general.architecture", gguf::val::str(variant == 1 ? "kimi-k3" : "deepseek4"));
  if (variant == 2) w.add_kv("general.alignment", gguf::val::u32(64));
  w.add_kv("x.block_count", gguf::val::u32(2));
  w.add_kv("x.flag", gguf::val::boolean(true));
  w.add_kv("x.f", gguf::val::f32(0.5f));
  w.add_kv("x.i64", gguf::val::i64(-3));
  w.add_kv("x.arr", gguf::val::str_array({"a", "bb"}));
  w.add_kv("x.nested", gguf::val::array(gguf::ValueType::ARRAY, {gguf::val::i32_array({1, -1})}));
  w.add_tensor("token_embd.weight", 0, {4, 2});
  if (variant == 0) w.add_tensor("blk.0.ffn_up_exps.weight", 39, {32, 2, 2});
  if (variant == 1) w.add_tensor("blk.1.ffn_down_exps.weight", 11, {256, 1, 2});
  if (variant == 2) w.add_tensor("blk.0.ffn_gate_exps.weight", 10, {256, 1, 2});
  w.add_tensor("output_norm.weight", 1, {4});
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < w.tensor_count(); ++i)
    data.push_back(std::vector<uint8_t>(w.tensor_nbytes(i), static_cast<uint8_t>(0x11 * (i + 1))));
  auto r = gguf::gguf_bytes(w, data);
  return r.ok() ? *r : std::vector<uint8_t>{};
}

std::vector<uint8_t> pack_index(uint32_t n_experts, uint32_t n_roles) {
  pack::Index idx;
  idx.n_experts = n_experts;
  idx.n_experts_used = 1;
  idx.arch = "kimi-k3";
  idx.layer_blocks = {1};
  const char* names[] = {"gate", "up", "down"};
  for (uint32_t r = 0; r < n_roles; ++r) {
    pack::Role role;
    role.name = names[r];
    role.type = r == 2 ? 11 : 10;
    role.n_dims = 2;
    role.ne = {256, 4, 1};
    role.nbytes = 4 * (r == 2 ? 110 : 84);
    role.source_pattern = std::string("blk.{block}.ffn_") + names[r] + "_exps.weight";
    role.source_n_dims = 3;
    role.source_ne = {256, 4, n_experts, 1};
    idx.roles.push_back(role);
  }
  idx.object_bytes = pack::place_roles(idx.roles);
  idx.object_stride = align_up(idx.object_bytes, pack::kAlignment);
  idx.shards.resize(1);
  idx.shards[0].metadata_bytes = 4096;
  idx.shards[0].file_size = 1 << 20;
  idx.shards[0].tensor_count = 10;
  idx.source_identity = pack::combine_identity(idx.shards);
  auto layout = pack::index_layout(idx.layer_blocks.size(), n_experts, n_roles, 1);
  if (!layout.ok()) return {};
  idx.data_start = layout->data_start;
  idx.file_size = idx.data_start + idx.n_objects() * idx.object_stride;
  idx.checksums.assign(idx.n_objects() * (1 + n_roles), 0x0123456789ABCDEFull);
  auto enc = pack::encode_index(idx);
  if (!enc.ok()) {
    std::fprintf(stderr, "encode_index: %s\n", enc.error().message.c_str());
    return {};
  }
  // decode_index wants the whole file (its size is checked), objects zero-filled.
  std::vector<uint8_t> file = *enc;
  file.resize(idx.file_size, 0);
  return file;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: gen-seed-corpus OUT_GGUF_DIR OUT_PACK_DIR\n");
    return 2;
  }
  bool ok = true;
  for (int v = 0; v < 3; ++v) {
    auto b = gguf_file(v);
    ok = ok && !b.empty() && save(std::string(argv[1]) + "/tiny" + std::to_string(v) + ".gguf", b);
  }
  auto p1 = pack_index(2, 3);
  ok = ok && !p1.empty() && save(std::string(argv[2]) + "/kimi-1x2x3.xpack", p1);
  return ok ? 0 : 1;
}
