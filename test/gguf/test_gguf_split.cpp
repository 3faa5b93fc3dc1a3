// gguf-split sets written with the Writer: a good set opens from any shard, and
// each inconsistency is refused with XPACK_E_SPLIT (or DUPLICATE).
#include <doctest/doctest.h>

#include <optional>

#include "fixtures.h"
#include "gguf/gguf_model.h"
#include "gguf_test_util.h"

using namespace xpack;
using namespace xpack::gguf;

namespace {

struct ShardFault {
  std::optional<uint32_t> split_no;       // override split.no of this shard
  std::optional<uint32_t> split_count;    // override split.count
  std::optional<int32_t> tensors_count;   // override split.tensors.count
  bool omit_split_keys = false;
  std::optional<std::string> extra_tensor;  // add a tensor of this name
};

// Writes a 3-shard set of 7 tensors (3 + 2 + 2) under dir/NAME-0000k-of-00003.gguf.
std::string write_set(const test::TempDir& dir, const std::string& name,
                      std::vector<ShardFault> faults = std::vector<ShardFault>(3)) {
  const uint32_t n = 3;
  const std::vector<std::vector<std::string>> parts = {
      {"token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ffn_up_exps.weight"},
      {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight"},
      {"output_norm.weight", "output.weight"}};
  std::string prefix = (dir / name).string();
  for (uint32_t k = 0; k < n; ++k) {
    const ShardFault& f = faults[k];
    Writer w;
    if (k == 0) {
      w.add_kv("general.architecture", val::str("kimi-k3"));
      w.add_kv("kimi-k3.expert_count", val::u32(2));
    }
    if (!f.omit_split_keys) {
      w.add_kv("split.no", val::u16(static_cast<uint16_t>(f.split_no.value_or(k))));
      w.add_kv("split.count", val::u16(static_cast<uint16_t>(f.split_count.value_or(n))));
      w.add_kv("split.tensors.count", val::i32(f.tensors_count.value_or(7)));
    }
    std::vector<std::string> names = parts[k];
    if (f.extra_tensor) names.push_back(*f.extra_tensor);
    for (const auto& t : names) {
      if (t.find("_exps") != std::string::npos)
        w.add_tensor(t, XPACK_TYPE_Q2_K, {256, 4, 2});
      else
        w.add_tensor(t, XPACK_TYPE_F32, {16});
    }
    std::vector<std::vector<uint8_t>> data;
    for (size_t i = 0; i < w.tensor_count(); ++i)
      data.push_back(test::pattern_bytes(k * 10 + i, w.tensor_nbytes(i)));
    REQUIRE(write_gguf(split_shard_path(prefix, k + 1, n), w, data).ok());
  }
  return prefix;
}

void expect_split_error(const std::string& path, int code = XPACK_E_SPLIT) {
  auto m = Model::open(path);
  REQUIRE_MESSAGE(!m.ok(), "a broken split set was accepted: " << path);
  CHECK_MESSAGE(m.error().code == code, m.error().message);
  CHECK(!m.error().message.empty());
}

}  // namespace

TEST_CASE("split: shard names") {
  auto s = parse_split_name("/a/b/model-00002-of-00038.gguf");
  REQUIRE(s);
  CHECK(s->prefix == "/a/b/model");
  CHECK(s->index == 2);
  CHECK(s->count == 38);
  CHECK(split_shard_path("/a/b/model", 3, 38) == "/a/b/model-00003-of-00038.gguf");
  CHECK(!parse_split_name("model.gguf"));
  CHECK(!parse_split_name("model-00000-of-00003.gguf"));
  CHECK(!parse_split_name("model-00004-of-00003.gguf"));
  CHECK(!parse_split_name("model-0001-of-0003.gguf"));
}

TEST_CASE("split: a good set opens from every shard") {
  test::TempDir dir;
  std::string prefix = write_set(dir, "m");
  for (uint32_t k = 1; k <= 3; ++k) {
    auto m = Model::open(split_shard_path(prefix, k, 3));
    REQUIRE_MESSAGE(m.ok(), m.error().message);
    CHECK(m->shards().size() == 3);
    CHECK(m->tensors().size() == 7);
    CHECK(m->arch() == "kimi-k3");
    const TensorInfo* down = m->find_tensor("blk.0.ffn_down_exps.weight");
    REQUIRE(down);
    CHECK(down->shard == 1);
    CHECK(m->find_tensor("output.weight")->shard == 2);
    auto p = m->tensor_data(*down);
    REQUIRE(p.ok());
    auto expect = test::pattern_bytes(1 * 10 + 1, down->nbytes);
    CHECK(std::memcmp(*p, expect.data(), expect.size()) == 0);
  }
}

TEST_CASE("split: inconsistent sets are refused") {
  test::TempDir dir;
  SUBCASE("missing shard") {
    std::string prefix = write_set(dir, "m");
    std::filesystem::remove(split_shard_path(prefix, 3, 3));
    expect_split_error(split_shard_path(prefix, 1, 3));
  }
  SUBCASE("wrong split.no") {
    std::vector<ShardFault> f(3);
    f[1].split_no = 2;
    expect_split_error(split_shard_path(write_set(dir, "m", f), 1, 3));
  }
  SUBCASE("split.count disagrees with the file names") {
    std::vector<ShardFault> f(3);
    f[2].split_count = 4;
    expect_split_error(split_shard_path(write_set(dir, "m", f), 2, 3));
  }
  SUBCASE("split.tensors.count disagrees with the tensors present") {
    std::vector<ShardFault> all(3);
    for (auto& x : all) x.tensors_count = 8;
    expect_split_error(split_shard_path(write_set(dir, "m", all), 1, 3));
  }
  SUBCASE("split.tensors.count differs between shards") {
    std::vector<ShardFault> f(3);
    f[2].tensors_count = 6;
    expect_split_error(split_shard_path(write_set(dir, "m", f), 1, 3));
  }
  SUBCASE("a shard without split keys") {
    std::vector<ShardFault> f(3);
    f[1].omit_split_keys = true;
    expect_split_error(split_shard_path(write_set(dir, "m", f), 1, 3));
  }
  SUBCASE("a tensor in two shards") {
    std::vector<ShardFault> f(3);
    for (auto& x : f) x.tensors_count = 8;
    f[2].extra_tensor = "token_embd.weight";
    expect_split_error(split_shard_path(write_set(dir, "m", f), 1, 3), XPACK_E_DUPLICATE);
  }
  SUBCASE("a damaged shard reports the shard's own error") {
    std::string prefix = write_set(dir, "m");
    auto path = split_shard_path(prefix, 2, 3);
    auto bytes = test::read_file(path);
    bytes.resize(bytes.size() / 2);
    test::write_file(path, bytes);
    auto m = Model::open(split_shard_path(prefix, 1, 3));
    REQUIRE(!m.ok());
    CHECK(m.error().code == XPACK_E_TRUNCATED);
    CHECK(m.error().message.find("00002-of-00003") != std::string::npos);
  }
}
