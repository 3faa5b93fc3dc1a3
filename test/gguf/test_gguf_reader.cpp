// The reader on real files: stories260K (test/data), llama.cpp's vocab GGUFs and
// the oracle models (../shared, skipped when absent).
#include <doctest/doctest.h>

#include <openssl/evp.h>

#include <cstdio>
#include <string>

#include "fixtures.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf_model.h"
#include "gguf_test_util.h"
#include "skip.h"

using namespace xpack;
using namespace xpack::gguf;
namespace fs = std::filesystem;

namespace {

std::string sha256_hex(const std::vector<uint8_t>& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  char buf[3];
  for (unsigned i = 0; i < len; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", md[i]);
    hex += buf;
  }
  return hex;
}

uint64_t n_elements(const TensorInfo& t) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < t.n_dims; ++d) n *= t.ne[d];
  return n;
}

}  // namespace

TEST_CASE("reader: stories260K.gguf") {
  fs::path path = test::data_dir() / "stories260K.gguf";
  auto bytes = test::read_file(path);
  REQUIRE(sha256_hex(bytes) == "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");

  auto m = Model::open(path.string());
  REQUIRE_MESSAGE(m.ok(), m.error().message);
  const File& f = m->meta();
  CHECK(f.version() == 3);
  CHECK(f.tensors().size() == 48);
  CHECK(f.kvs().size() == 19);
  CHECK(f.alignment() == 32);
  CHECK(f.data_offset() == 14176);
  CHECK(f.file_size() == bytes.size());
  CHECK(m->shards().size() == 1);
  CHECK(m->arch() == "llama");
  uint64_t params = 0;
  for (const auto& t : m->tensors()) params += n_elements(t);
  CHECK(params == 292800);

  CHECK(f.get_uint("llama.block_count").value() == 5);
  CHECK(f.get_uint("llama.embedding_length").value() == 64);
  CHECK(f.get_string("tokenizer.ggml.model").value() == "llama");
  const Value* tokens = f.find("tokenizer.ggml.tokens");
  REQUIRE(tokens);
  CHECK(tokens->type == ValueType::ARRAY);
  CHECK(tokens->elem_type == ValueType::STRING);
  CHECK(tokens->array_size() == 512);
  CHECK(f.get_string("llama.block_count").error().code == XPACK_E_TYPE);
  CHECK(f.get_uint("no.such.key").error().code == XPACK_E_NOT_FOUND);

  const TensorInfo* emb = m->find_tensor("token_embd.weight");
  REQUIRE(emb);
  CHECK(emb->type == 0);
  CHECK(emb->n_dims == 2);
  CHECK(emb->ne[0] == 64);
  CHECK(emb->ne[1] == 512);
  CHECK(emb->offset == 0);
  CHECK(emb->file_offset == 14176);
  CHECK(emb->nbytes == 64 * 512 * 4);
  const TensorInfo* out = m->find_tensor("output.weight");
  REQUIRE(out);
  CHECK(out->file_offset == 145504);
  // The mapped bytes are the file's bytes at file_offset.
  auto p = m->tensor_data(*out);
  REQUIRE(p.ok());
  CHECK(std::memcmp(*p, bytes.data() + out->file_offset, out->nbytes) == 0);
  CHECK(m->find_tensor("nope") == nullptr);
}

TEST_CASE("reader: llama.cpp vocab GGUFs (0 tensors, big arrays)") {
  auto shared = test::shared_dir();
  if (!shared) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared not present (vocab GGUFs)");
    return;
  }
  struct Case { const char* file; const char* arch; size_t kvs; size_t tokens; size_t merges; };
  const Case cases[] = {
      {"ggml-vocab-deepseek-llm.gguf", "llama", 23, 102400, 99757},
      {"ggml-vocab-gpt-2.gguf", "gpt2", 16, 50257, 50000},
      {"ggml-vocab-llama-spm.gguf", "llama", 22, 32000, 0},
  };
  for (const auto& c : cases) {
    INFO(c.file);
    auto m = Model::open((*shared / "models" / "vocab" / c.file).string());
    REQUIRE_MESSAGE(m.ok(), m.error().message);
    CHECK(m->tensors().empty());
    CHECK(m->arch() == c.arch);
    CHECK(m->meta().kvs().size() == c.kvs);
    const Value* tokens = m->meta().find("tokenizer.ggml.tokens");
    REQUIRE(tokens);
    CHECK(tokens->array_size() == c.tokens);
    const Value* merges = m->meta().find("tokenizer.ggml.merges");
    CHECK((merges ? merges->array_size() : 0) == c.merges);
  }
}

TEST_CASE("reader: oracle split set presents the single file's tensor table") {
  auto shared = test::shared_dir();
  if (!shared) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared not present (oracle models)");
    return;
  }
  fs::path dir = *shared / "oracle" / "models";
  auto single = Model::open((dir / "kimi-k3-q2k-q3k.gguf").string());
  REQUIRE_MESSAGE(single.ok(), single.error().message);
  CHECK(single->tensors().size() == 102);
  CHECK(single->arch() == "kimi-k3");

  for (int k = 1; k <= 3; ++k) {
    std::string shard = (dir / ("kimi-k3-q2k-q3k-0000" + std::to_string(k) + "-of-00003.gguf")).string();
    INFO(shard);
    auto m = Model::open(shard);
    REQUIRE_MESSAGE(m.ok(), m.error().message);
    CHECK(m->shards().size() == 3);
    CHECK(m->tensors().size() == 102);
    CHECK(m->arch() == "kimi-k3");  // metadata from shard 1 whichever shard was named
    CHECK(m->meta().get_uint("kimi-k3.expert_count").value() == 8);
    size_t per_shard[3] = {0, 0, 0};
    for (const auto& t : m->tensors()) {
      REQUIRE(t.shard < 3);
      ++per_shard[t.shard];
      const TensorInfo* s = single->find_tensor(t.name);
      REQUIRE_MESSAGE(s, t.name);
      CHECK(s->type == t.type);
      CHECK(s->n_dims == t.n_dims);
      CHECK(s->ne == t.ne);
      CHECK(s->nbytes == t.nbytes);
      CHECK(t.file_offset + t.nbytes <= m->shards()[t.shard].file_size());
    }
    CHECK(per_shard[0] == 34);
    CHECK(per_shard[1] == 34);
    CHECK(per_shard[2] == 34);
    if (k == 2) {
      // Same bytes as the single file for every tensor (spot-check the experts fully).
      for (const auto& t : m->tensors()) {
        if (t.name.find("_exps.") == std::string::npos) continue;
        auto a = m->tensor_data(t);
        auto b = single->tensor_data(*single->find_tensor(t.name));
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        CHECK_MESSAGE(std::memcmp(*a, *b, t.nbytes) == 0, t.name);
      }
    }
  }
  // Asking for one file only gives that shard's 34 tensors.
  auto one = Model::open((dir / "kimi-k3-q2k-q3k-00002-of-00003.gguf").string(), true);
  REQUIRE(one.ok());
  CHECK(one->shards().size() == 1);
  CHECK(one->tensors().size() == 34);
  CHECK(one->arch().empty());  // shard 2 carries only the split keys
}

TEST_CASE("reader: oracle expert tensor types") {
  auto shared = test::shared_dir();
  if (!shared) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared not present (oracle models)");
    return;
  }
  fs::path dir = *shared / "oracle" / "models";
  auto ds = Model::open((dir / "deepseek4-mxfp4.gguf").string());
  REQUIRE_MESSAGE(ds.ok(), ds.error().message);
  CHECK(ds->arch() == "deepseek4");
  int experts = 0;
  for (const auto& t : ds->tensors()) {
    if (t.name.find("_exps.weight") == std::string::npos) continue;
    ++experts;
    CHECK(t.type == XPACK_TYPE_MXFP4);
    CHECK(t.n_dims == 3);
    CHECK(t.nbytes == t.ne[0] / 32 * 17 * t.ne[1] * t.ne[2]);
  }
  CHECK(experts > 0);
  auto kimi = Model::open((dir / "kimi-k3-q2k-q3k.gguf").string());
  REQUIRE(kimi.ok());
  const TensorInfo* gate = kimi->find_tensor("blk.1.ffn_gate_exps.weight");
  const TensorInfo* down = kimi->find_tensor("blk.1.ffn_down_exps.weight");
  REQUIRE(gate);
  REQUIRE(down);
  CHECK(gate->type == XPACK_TYPE_Q2_K);
  CHECK(down->type == XPACK_TYPE_Q3_K);
  CHECK(gate->nbytes == 172032);
  CHECK(down->nbytes == 225280);
  CHECK(kimi->find_tensor("blk.0.ffn_gate_exps.weight") == nullptr);  // dense leading layer
}

TEST_CASE("reader: type table") {
  struct Row { uint32_t id; const char* name; uint32_t be, bb; };
  const Row rows[] = {{0, "F32", 1, 4},    {1, "F16", 1, 2},     {30, "BF16", 1, 2},
                      {8, "Q8_0", 32, 34}, {10, "Q2_K", 256, 84}, {11, "Q3_K", 256, 110},
                      {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210},
                      {39, "MXFP4", 32, 17}};
  for (const auto& r : rows) {
    INFO(r.name);
    const TypeInfo* t = type_info(r.id);
    REQUIRE(t);
    CHECK(std::string(t->name) == r.name);
    CHECK(t->block_elems == r.be);
    CHECK(t->block_bytes == r.bb);
    CHECK(type_by_name(r.name) == t);
  }
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 41u, 12345u}) CHECK(type_info(id) == nullptr);
  CHECK(type_by_name("q2_k") == nullptr);
}
