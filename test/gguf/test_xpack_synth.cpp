// xpack-synth output: the shapes, types, metadata and quant blocks the seed
// models have, determinism, and gguf-split sets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "fixtures.h"
#include "gguf/gguf_model.h"
#include "gguf_test_util.h"
#include "xpack/xpack.h"

using namespace xpack;
using namespace xpack::gguf;

namespace {

std::string synth() { return (test::build_dir() / "tools" / "xpack-synth").string(); }

void run_synth(const std::string& args, int expect_rc = 0, std::string* out = nullptr) {
  std::string output;
  int rc = test::run_command(synth() + " " + args, &output);
  CHECK_MESSAGE(rc == expect_rc, "xpack-synth " << args << "\n" << output);
  if (out) *out = output;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 0x3FF;
  if (exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                     : std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Checks every block's scale fields are finite and in a sane range; returns the
// number of blocks checked.
uint64_t check_quant_blocks(const TensorInfo& t, const uint8_t* p) {
  std::vector<size_t> f16_fields;
  size_t block = 0;
  switch (t.type) {
    case XPACK_TYPE_Q8_0: block = 34; f16_fields = {0}; break;
    case XPACK_TYPE_Q2_K: block = 84; f16_fields = {80, 82}; break;
    case XPACK_TYPE_Q3_K: block = 110; f16_fields = {108}; break;
    case XPACK_TYPE_MXFP4: block = 17; break;
    default: return 0;
  }
  REQUIRE(t.nbytes % block == 0);
  uint64_t n = t.nbytes / block, bad = 0;
  for (uint64_t b = 0; b < n; ++b) {
    const uint8_t* blk = p + b * block;
    for (size_t off : f16_fields) {
      float d = f16_to_f32(rd16(blk + off));
      if (!std::isfinite(d) || d <= 0 || d > 1) ++bad;
    }
    if (t.type == XPACK_TYPE_MXFP4 && (blk[0] < 100 || blk[0] > 130)) ++bad;  // E8M0 scale
  }
  CHECK_MESSAGE(bad == 0, t.name);
  return n;
}

struct ArchCase {
  const char* arch;
  const char* gguf_arch;
  uint32_t gate_type, down_type;
  uint32_t dense;
};

}  // namespace

TEST_CASE("xpack-synth: --help and argument errors") {
  std::string out;
  run_synth("--help", 0, &out);
  CHECK(out.find("--arch") != std::string::npos);
  CHECK(out.find("--shards") != std::string::npos);
  test::TempDir dir;
  auto o = (dir / "x.gguf").string();
  run_synth("-o " + o, 2);                                    // no --arch
  run_synth("--arch gpt5 -o " + o, 2);                        // unknown arch
  run_synth("--arch deepseek4", 2);                           // no output
  run_synth("--arch kimi-k3 --ff 96 -o " + o, 2);             // Q2_K needs 256
  run_synth("--arch deepseek4 --embd 100 -o " + o, 2);        // MXFP4 needs 32
  run_synth("--arch mixtral --top-k 9 --experts 8 -o " + o, 2);
  run_synth("--arch kimi-k3 --layers 2 --dense-layers 2 -o " + o, 2);
  run_synth("--arch deepseek4 --layers x -o " + o, 2);
  run_synth("--arch deepseek4 --bogus -o " + o, 2);
  CHECK(!std::filesystem::exists(o));
}

// The command-line conventions of tools/cli_app.h, as xpack-synth applies them.
TEST_CASE("xpack-synth: --version, --help lists every flag, --key=value") {
  std::string out;
  run_synth("--version", 0, &out);
  CHECK(out == std::string("xpack-synth ") + xpack_version() + "\n");
  run_synth("--help", 0, &out);
  for (const char* flag : {"--arch", "--layers", "--experts", "--top-k", "--dense-layers", "--embd", "--ff",
                           "--latent", "--vocab", "--fused-gate-up", "--shards", "--seed", "-o, --output",
                           "-q, --quiet", "-h, --help", "--version", "exit status", "--preset", "--f32",
                           "--heads", "--dense-ff", "--hash-layers", "--compress-ratios", "--progress", "--dry-run", "--trunk-type",
                           "oracle-deepseek4", "oracle-kimi-k3", "deepseek-v4-flash", "Random weights"})
    CHECK_MESSAGE(out.find(flag) != std::string::npos, flag);

  // --key=value and --key value mean the same; so do -o PATH and --output=PATH.
  test::TempDir dir;
  auto a = (dir / "a.gguf").string(), b = (dir / "b.gguf").string();
  run_synth("-q --arch=mixtral --layers=2 --experts=4 --top-k=1 --seed=5 --output=" + a);
  run_synth("-q --arch mixtral --layers 2 --experts 4 --top-k 1 --seed 5 -o " + b);
  CHECK(test::read_file(a) == test::read_file(b));
  auto m = Model::open(a);
  REQUIRE_MESSAGE(m.ok(), m.error().message);
  CHECK(m->meta().get_uint("llama.block_count").value() == 2);
  CHECK(m->meta().get_uint("llama.expert_count").value() == 4);
}

TEST_CASE("xpack-synth: usage errors exit 2 with one line naming the flag") {
  test::TempDir dir;
  auto o = (dir / "x.gguf").string();
  struct Case {
    std::string args, says;
  };
  const Case cases[] = {
      {"--arch deepseek4 --bogus -o " + o, "unknown option --bogus"},
      {"--arch gpt5 -o " + o, "--arch: 'gpt5' is not one of deepseek4, kimi-k3, mixtral"},
      {"--arch deepseek4 --layers x -o " + o, "--layers: expected a whole number, got 'x'"},
      {"--arch deepseek4 --layers=4K -o " + o, "--layers: expected a whole number, got '4K' (a count takes no"},
      {"--arch deepseek4 --layers 5000 -o " + o, "--layers: 5000 is out of range (1..4096)"},
      {"--arch deepseek4 --experts 0 -o " + o, "--experts: 0 is out of range (1..65535)"},
      {"--arch deepseek4 --vocab -1 -o " + o, "--vocab: expected a whole number, got '-1'"},
      {"--arch deepseek4 --seed 0x10 -o " + o, "--seed: expected a whole number, got '0x10'"},
      {"--arch deepseek4 --seed 18446744073709551616 -o " + o, "--seed: 18446744073709551616 is out of range"},
      {"--arch deepseek4 --shards", "--shards needs a value"},
      {"--arch deepseek4", "--output is required"},
      {"-o " + o, "--arch is required"},
      {"--arch mixtral --top-k 9 --experts 8 -o " + o, "--top-k exceeds --experts"},
      {"--arch deepseek4 --preset kimi-k3 -o " + o, "--arch and --preset exclude each other"},
      {"--preset kimi-k2 -o " + o, "--preset: 'kimi-k2' is not one of"},
      {"--preset oracle-deepseek4 --compress-ratios 4,5 -o " + o, "--compress-ratios: '4,5' is not a list of 0, 4"},
      {"--preset oracle-deepseek4 --compress-ratios 4,,128 -o " + o, "--compress-ratios: '4,,128' is not a list"},
      {"--arch kimi-k3 --hash-layers 1 -o " + o, "--hash-layers and --compress-ratios are deepseek4 only"},
      {"--arch deepseek4 --dense-ff 512 -o " + o, "--dense-ff is kimi-k3 only"},
      {"--preset oracle-deepseek4 --heads 3 -o " + o, "--heads must be a multiple of the output groups (2)"},
  };
  for (const auto& c : cases) {
    std::string out;
    run_synth(c.args, 2, &out);
    INFO(c.args << "\n" << out);
    CHECK(out.find(c.says) != std::string::npos);
    CHECK(out.find("run with --help") != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
  CHECK(!std::filesystem::exists(o));
  // The largest seed is accepted (it is a 64-bit number, not a count with a small range).
  run_synth("-q --arch mixtral --layers 2 --experts 4 --top-k 1 --seed 18446744073709551615 -o " + o);
}

TEST_CASE("xpack-synth: models shaped like the seed models") {
  const ArchCase cases[] = {
      {"deepseek4", "deepseek4", XPACK_TYPE_MXFP4, XPACK_TYPE_MXFP4, 0},
      {"kimi-k3", "kimi-k3", XPACK_TYPE_Q2_K, XPACK_TYPE_Q3_K, 1},
      {"mixtral", "llama", XPACK_TYPE_Q8_0, XPACK_TYPE_Q8_0, 0},
  };
  test::TempDir dir;
  for (const auto& c : cases) {
    INFO(c.arch);
    auto path = (dir / (std::string(c.arch) + ".gguf")).string();
    run_synth(std::string("-q --arch ") + c.arch + " --layers 3 --experts 6 --top-k 3 --embd 256 --ff 512 -o " + path);
    auto m = Model::open(path);
    REQUIRE_MESSAGE(m.ok(), m.error().message);
    const File& f = m->meta();
    std::string a = c.gguf_arch;
    CHECK(m->arch() == a);
    CHECK(f.get_uint(a + ".block_count").value() == 3);
    CHECK(f.get_uint(a + ".expert_count").value() == 6);
    CHECK(f.get_uint(a + ".expert_used_count").value() == 3);
    CHECK(f.get_uint(a + ".embedding_length").value() == 256);
    if (a == "kimi-k3") CHECK(f.get_uint(a + ".leading_dense_block_count").value() == c.dense);
    // Every DeepSeek-V4 layer is MoE: the key is written only for a requested dense block.
    if (a == "deepseek4") CHECK(f.find(a + ".leading_dense_block_count") == nullptr);
    if (a != "llama") CHECK(f.get_uint(a + ".expert_feed_forward_length").value() == 512);
    CHECK(f.find("tokenizer.ggml.tokens")->array_size() == 512);
    for (uint32_t b = 0; b < 3; ++b) {
      std::string p = "blk." + std::to_string(b) + ".";
      const TensorInfo* gate = m->find_tensor(p + "ffn_gate_exps.weight");
      const TensorInfo* up = m->find_tensor(p + "ffn_up_exps.weight");
      const TensorInfo* down = m->find_tensor(p + "ffn_down_exps.weight");
      if (b < c.dense) {
        CHECK(gate == nullptr);
        CHECK(down == nullptr);
        CHECK(m->find_tensor(p + "ffn_gate_inp.weight") == nullptr);
        CHECK(m->find_tensor(p + "ffn_up.weight") != nullptr);
        continue;
      }
      REQUIRE(gate);
      REQUIRE(up);
      REQUIRE(down);
      CHECK(gate->type == c.gate_type);
      CHECK(up->type == c.gate_type);
      CHECK(down->type == c.down_type);
      CHECK(gate->n_dims == 3);
      CHECK(gate->ne == std::array<uint64_t, 4>{256, 512, 6, 1});
      CHECK(up->ne == gate->ne);
      CHECK(down->ne == std::array<uint64_t, 4>{512, 256, 6, 1});
      const TensorInfo* router = m->find_tensor(p + "ffn_gate_inp.weight");
      REQUIRE(router);
      CHECK(router->ne == std::array<uint64_t, 4>{256, 6, 1, 1});
      if (a != "llama") {
        // deepseek4's hash layers (min(3, layers) by default) route by token id, without a bias.
        CHECK((m->find_tensor(p + "exp_probs_b.bias") != nullptr) == (a == "kimi-k3" || b >= 3));
        CHECK(m->find_tensor(p + "ffn_gate_shexp.weight") != nullptr);
        CHECK(m->find_tensor(p + "ffn_down_shexp.weight") != nullptr);
      }
    }
    uint64_t blocks = 0;
    for (const auto& t : m->tensors()) {
      auto p = m->tensor_data(t);
      REQUIRE(p.ok());
      blocks += check_quant_blocks(t, *p);
      if (t.type == XPACK_TYPE_F32) {
        const float* x = reinterpret_cast<const float*>(*p);
        bool finite = true;
        for (uint64_t k = 0; k < t.nbytes / 4; ++k) finite = finite && std::isfinite(x[k]);
        CHECK_MESSAGE(finite, t.name);
      }
    }
    CHECK(blocks > 1000);
  }
}

TEST_CASE("xpack-synth: hash-routing table of deepseek4 holds valid expert ids") {
  test::TempDir dir;
  auto path = (dir / "d.gguf").string();
  run_synth("-q --arch deepseek4 --layers 4 --experts 5 --top-k 2 -o " + path);
  auto m = Model::open(path);
  REQUIRE(m.ok());
  CHECK(m->meta().get_uint("deepseek4.expert_gating_func").value() == 4);
  for (uint32_t b = 0; b < 4; ++b) {
    const TensorInfo* t = m->find_tensor("blk." + std::to_string(b) + ".ffn_gate_tid2eid.weight");
    if (b >= 3) {
      CHECK(t == nullptr);
      continue;
    }
    REQUIRE(t);
    CHECK(t->type == XPACK_TYPE_I32);
    CHECK(t->ne == std::array<uint64_t, 4>{2, 512, 1, 1});
    auto p = m->tensor_data(*t);
    REQUIRE(p.ok());
    const int32_t* ids = reinterpret_cast<const int32_t*>(*p);
    bool in_range = true;
    for (uint64_t k = 0; k < t->nbytes / 4; ++k) in_range = in_range && ids[k] >= 0 && ids[k] < 5;
    CHECK(in_range);
  }
}

TEST_CASE("xpack-synth: deterministic from --seed") {
  test::TempDir dir;
  auto a = (dir / "a.gguf").string(), b = (dir / "b.gguf").string(), c = (dir / "c.gguf").string();
  run_synth("-q --arch kimi-k3 --seed 7 -o " + a);
  run_synth("-q --arch kimi-k3 --seed 7 -o " + b);
  run_synth("-q --arch kimi-k3 --seed 8 -o " + c);
  auto ba = test::read_file(a), bb = test::read_file(b), bc = test::read_file(c);
  CHECK(ba == bb);
  REQUIRE(ba.size() == bc.size());  // same layout ...
  CHECK(ba != bc);                  // ... different weights
}

TEST_CASE("xpack-synth: fused gate_up variant") {
  test::TempDir dir;
  auto path = (dir / "f.gguf").string();
  run_synth("-q --arch deepseek4 --layers 2 --experts 4 --fused-gate-up --embd 64 --ff 96 -o " + path);
  auto m = Model::open(path);
  REQUIRE(m.ok());
  const TensorInfo* gu = m->find_tensor("blk.1.ffn_gate_up_exps.weight");
  REQUIRE(gu);
  CHECK(gu->type == XPACK_TYPE_MXFP4);
  CHECK(gu->ne == std::array<uint64_t, 4>{64, 192, 4, 1});
  CHECK(m->find_tensor("blk.1.ffn_gate_exps.weight") == nullptr);
  CHECK(m->find_tensor("blk.1.ffn_up_exps.weight") == nullptr);
  CHECK(m->find_tensor("blk.1.ffn_down_exps.weight") != nullptr);
}

TEST_CASE("xpack-synth: --shards writes a gguf-split set equal to the single file") {
  test::TempDir dir;
  auto single = (dir / "k.gguf").string();
  auto split = (dir / "ks.gguf").string();
  run_synth("-q --arch kimi-k3 --layers 5 --seed 3 -o " + single);
  run_synth("-q --arch kimi-k3 --layers 5 --seed 3 --shards 4 -o " + split);
  auto one = Model::open(single);
  REQUIRE(one.ok());
  for (uint32_t k = 1; k <= 4; ++k) {
    auto shard_path = split_shard_path((dir / "ks").string(), k, 4);
    REQUIRE(std::filesystem::exists(shard_path));
    // Each shard is a self-contained GGUF with the split keys of gguf-split.
    auto f = File::open(shard_path);
    REQUIRE_MESSAGE(f.ok(), f.error().message);
    const Value* no = f->find("split.no");
    const Value* count = f->find("split.count");
    const Value* total = f->find("split.tensors.count");
    REQUIRE(no);
    REQUIRE(count);
    REQUIRE(total);
    CHECK(no->type == ValueType::U16);
    CHECK(no->u == k - 1);
    CHECK(count->type == ValueType::U16);
    CHECK(count->u == 4);
    CHECK(total->type == ValueType::I32);
    CHECK(total->u == one->tensors().size());
    // Other metadata only in the first shard.
    CHECK((f->find("general.architecture") != nullptr) == (k == 1));
    CHECK(f->kvs().size() == (k == 1 ? one->meta().kvs().size() + 3 : 3));
  }
  auto set = Model::open(split_shard_path((dir / "ks").string(), 3, 4));
  REQUIRE_MESSAGE(set.ok(), set.error().message);
  CHECK(set->shards().size() == 4);
  REQUIRE(set->tensors().size() == one->tensors().size());
  for (const auto& t : one->tensors()) {
    const TensorInfo* s = set->find_tensor(t.name);
    REQUIRE_MESSAGE(s, t.name);
    CHECK(s->type == t.type);
    CHECK(s->ne == t.ne);
    auto a = one->tensor_data(t);
    auto b = set->tensor_data(*s);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK_MESSAGE(std::memcmp(*a, *b, t.nbytes) == 0, t.name);
  }
  // Metadata equal apart from the split keys.
  for (const auto& kv : one->meta().kvs()) {
    const Value* v = set->meta().find(kv.key);
    REQUIRE_MESSAGE(v, kv.key);
    CHECK(test::same_value(*v, kv.value));
  }
  run_synth("-q --arch kimi-k3 --shards 1000 -o " + (dir / "too-many.gguf").string(), 1);
}

namespace {
std::vector<int64_t> int_array(const File& f, const std::string& key) {
  std::vector<int64_t> v;
  const Value* a = f.find(key);
  REQUIRE_MESSAGE(a, key);
  for (uint64_t i = 0; i < a->array_size(); ++i) v.push_back(a->element(i).as_i64());
  return v;
}
std::array<uint64_t, 4> ne_of(const Model& m, const std::string& name) {
  const TensorInfo* t = m.find_tensor(name);
  REQUIRE_MESSAGE(t, name);
  return t->ne;
}
}  // namespace

// The presets' per-layer patterns and the flags that override them (the oracle
// presets' whole key and tensor sets are checked by synth_oracle.py with gguf-py).
TEST_CASE("xpack-synth: presets, per-layer patterns and overrides") {
  test::TempDir dir;
  auto path = (dir / "p.gguf").string();
  SUBCASE("oracle-deepseek4 repeats the oracle's ratios over more layers") {
    run_synth("-q --preset oracle-deepseek4 --layers 6 -o " + path);
    auto m = Model::open(path);
    REQUIRE(m.ok());
    CHECK(int_array(m->meta(), "deepseek4.attention.compress_ratios") == std::vector<int64_t>{0, 4, 128, 4, 0, 4});
    CHECK(m->meta().find("deepseek4.swiglu_clamp_exp")->array_size() == 6);
    CHECK(m->meta().get_uint("deepseek4.hash_layer_count").value() == 1);
    CHECK(m->find_tensor("blk.0.ffn_gate_tid2eid.weight") != nullptr);
    CHECK(m->find_tensor("blk.1.ffn_gate_tid2eid.weight") == nullptr);
    CHECK(m->find_tensor("blk.4.attn_compressor_kv.weight") == nullptr);  // ratio 0: window only
    CHECK(ne_of(*m, "blk.5.indexer_compressor_ape.weight") == std::array<uint64_t, 4>{128, 4, 1, 1});
  }
  SUBCASE("--compress-ratios and --hash-layers") {
    run_synth("-q --preset oracle-deepseek4 --layers 2 --compress-ratios 128 --hash-layers 0 -o " + path);
    auto m = Model::open(path);
    REQUIRE(m.ok());
    CHECK(int_array(m->meta(), "deepseek4.attention.compress_ratios") == std::vector<int64_t>{128, 128});
    for (int b = 0; b < 2; ++b) {
      std::string p = "blk." + std::to_string(b) + ".";
      CHECK(m->find_tensor(p + "ffn_gate_tid2eid.weight") == nullptr);
      CHECK(m->find_tensor(p + "exp_probs_b.bias") != nullptr);
      CHECK(m->find_tensor(p + "indexer.proj.weight") == nullptr);  // HCA has no indexer
      CHECK(ne_of(*m, p + "attn_compressor_ape.weight") == std::array<uint64_t, 4>{128, 128, 1, 1});
    }
  }
  SUBCASE("deepseek-v4-flash: the real model's attention and routing, narrower") {
    run_synth("-q --preset deepseek-v4-flash --layers 4 --embd 256 --heads 8 --experts 8 --ff 256 --vocab 512 -o " +
              path);
    auto m = Model::open(path);
    REQUIRE(m.ok());
    const File& f = m->meta();
    CHECK(int_array(f, "deepseek4.attention.compress_ratios") == std::vector<int64_t>{0, 0, 4, 128});
    CHECK(f.get_uint("deepseek4.hash_layer_count").value() == 3);
    CHECK(f.get_uint("deepseek4.attention.key_length").value() == 512);
    CHECK(f.get_uint("deepseek4.attention.sliding_window").value() == 128);
    CHECK(f.get_uint("deepseek4.attention.indexer.top_k").value() == 512);
    CHECK(f.get_uint("deepseek4.attention.output_lora_rank").value() == 1024);
    CHECK(f.get_uint("deepseek4.expert_used_count").value() == 6);
    CHECK(f.get_uint("deepseek4.context_length").value() == 1048576);
    CHECK(ne_of(*m, "blk.2.indexer.attn_q_b.weight") == std::array<uint64_t, 4>{1024, 64 * 128, 1, 1});
    CHECK(ne_of(*m, "blk.3.attn_compressor_ape.weight") == std::array<uint64_t, 4>{512, 128, 1, 1});
    CHECK(m->find_tensor("blk.0.ffn_gate_exps.weight")->type == XPACK_TYPE_MXFP4);
    CHECK(m->find_tensor("blk.0.attn_q_b.weight")->type == XPACK_TYPE_Q8_0);
    CHECK(m->find_tensor("blk.0.hc_attn_fn.weight")->type == XPACK_TYPE_F32);
  }
  SUBCASE("kimi-k3: KDA with MLA every 4th layer and on the last") {
    run_synth("-q --preset kimi-k3 --layers 5 --embd 512 --heads 4 --dense-ff 512 --experts 20 --latent 512 "
              "--ff 512 --vocab 512 -o " + path);
    auto m = Model::open(path);
    REQUIRE(m.ok());
    const File& f = m->meta();
    CHECK(int_array(f, "kimi-k3.attention.head_count_kv") == std::vector<int64_t>{0, 0, 0, 1, 1});
    CHECK(f.get_uint("kimi-k3.kda.head_dim").value() == 128);
    CHECK(f.get_uint("kimi-k3.attention.key_length").value() == 512 + 64);
    CHECK(f.get_uint("kimi-k3.attention.key_length_mla").value() == 128 + 64);
    CHECK(f.get_uint("kimi-k3.attention.value_length_mla").value() == 128);
    CHECK(f.get_uint("kimi-k3.attn_res.block_size").value() == 12);
    CHECK(f.get_uint("kimi-k3.expert_used_count").value() == 16);
    CHECK(f.get_uint("kimi-k3.expert_shared_count").value() == 2);
    CHECK(f.get_uint("kimi-k3.leading_dense_block_count").value() == 1);
    CHECK(ne_of(*m, "blk.3.attn_k_b.weight") == std::array<uint64_t, 4>{128, 512, 4, 1});
    CHECK(ne_of(*m, "blk.2.ssm_conv1d_q.weight") == std::array<uint64_t, 4>{4, 1, 512, 1});
    CHECK(m->find_tensor("blk.2.attn_kv_a_mqa.weight") == nullptr);
    CHECK(m->find_tensor("blk.4.ffn_gate_exps.weight")->type == XPACK_TYPE_Q2_K);
    CHECK(m->find_tensor("blk.4.ffn_down_exps.weight")->type == XPACK_TYPE_Q3_K);
    CHECK(m->find_tensor("blk.4.attn_gate.weight")->type == XPACK_TYPE_MXFP4);  // the preset's trunk
    CHECK(m->find_tensor("blk.4.ffn_routed_norm.weight")->type == XPACK_TYPE_F32);
  }
  SUBCASE("--f32: every float tensor F32, no quantization_version") {
    run_synth("-q --preset oracle-kimi-k3 --f32 -o " + path);
    auto m = Model::open(path);
    REQUIRE(m.ok());
    CHECK(m->meta().find("general.quantization_version") == nullptr);
    CHECK(m->meta().get_uint("general.file_type").value() == 0);
    for (const auto& t : m->tensors()) CHECK_MESSAGE(t.type == XPACK_TYPE_F32, t.name);
  }
}

// The full presets are too large to write in a test; --dry-run lays them out and
// reports their size, which must be near the published files' (the seed's report:
// the DeepSeek-V4-Flash Ollama MXFP4 blob 155.10 GB, the 38 Kimi-K3 shards 1009.51 GB).
TEST_CASE("xpack-synth: --dry-run sizes of the full presets against the published files") {
  test::TempDir dir;
  auto path = (dir / "full.gguf").string();
  struct Case {
    const char* args;
    double published;
  };
  for (const Case& c : {Case{"--preset deepseek-v4-flash", 155.10e9}, Case{"--preset kimi-k3", 1009.51e9}}) {
    std::string out;
    run_synth(std::string(c.args) + " --dry-run -o " + path, 0, &out);
    INFO(out);
    CHECK(out.find("dry run: nothing written") != std::string::npos);
    auto at = out.find(" tensors, ");
    REQUIRE(at != std::string::npos);
    double bytes = std::stod(out.substr(at + 10));
    CHECK(std::abs(bytes / c.published - 1.0) < 0.01);
    CHECK(!std::filesystem::exists(path));
  }
  // Q8_0 everywhere makes Kimi-K3 4 % larger than published: the trunk type matters.
  std::string out;
  run_synth("--preset kimi-k3 --trunk-type Q8_0 --dry-run -o " + path, 0, &out);
  auto at = out.find(" tensors, ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(out.substr(at + 10)) / 1009.51e9 > 1.03);
  run_synth("--arch mixtral --trunk-type MXFP4 --dry-run -o " + path, 2);
}

// Tensors are streamed through a 16 MiB buffer: one that spans several chunks is
// valid all through, and the chunks continue one stream (not the same bytes again).
TEST_CASE("xpack-synth: a tensor larger than the write buffer, and --progress") {
  test::TempDir dir;
  auto path = (dir / "big.gguf").string();
  std::string out;
  run_synth("--arch deepseek4 --layers 1 --experts 20 --embd 2048 --ff 1024 --hash-layers 0 --progress -q -o " + path, 0,
            &out);
  // --progress draws even into a pipe, and ends at 100 %; -q alone draws nothing.
  CHECK(out.find("writing [") != std::string::npos);
  CHECK(out.find("100.0%") != std::string::npos);
  auto m = Model::open(path);
  REQUIRE(m.ok());
  const TensorInfo* t = m->find_tensor("blk.0.ffn_gate_exps.weight");
  REQUIRE(t);
  const uint64_t chunk = uint64_t{16} << 20;
  REQUIRE(t->nbytes > chunk + (1 << 20));
  auto p = m->tensor_data(*t);
  REQUIRE(p.ok());
  CHECK(check_quant_blocks(*t, *p) == t->nbytes / 17);
  CHECK(std::memcmp(*p, *p + chunk, 1 << 20) != 0);
  run_synth("--arch deepseek4 --layers 1 --experts 2 -q -o " + path, 0, &out);
  CHECK(out.empty());
}
