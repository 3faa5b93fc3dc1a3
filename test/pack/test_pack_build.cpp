// xpack-build / xpack-inspect, run as programs: round trips on real (oracle) and
// synthetic models, split sets, resume, consume-source, damage and bad input.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "gguf/gguf_writer.h"
#include "pack/builder.h"
#include "pack/pack_reader.h"
#include "pack_test_util.h"
#include "roundtrip_check.h"
#include "skip.h"
#include "xpack/xpack.h"

using namespace xpack;
using namespace xpack::test;

namespace {

bool same_file(const fs::path& a, const fs::path& b) {
  auto x = read_file(a), y = read_file(b);
  return !x.empty() && x == y;
}

std::string read_file_string(const fs::path& p) {
  auto b = read_file(p);
  return std::string(b.begin(), b.end());
}

fs::path other_model_for_resume(const TempDir& tmp) {
  return synth(tmp / "other.gguf", "--arch kimi-k3 --layers 4 --experts 8 --seed 7");
}

fs::path oracle(const fs::path& shared, const std::string& name) { return shared / "oracle" / "models" / name; }

void copy_split(const fs::path& shared, const fs::path& dir) {
  for (int k = 1; k <= 3; ++k) {
    std::string n = "kimi-k3-q2k-q3k-0000" + std::to_string(k) + "-of-00003.gguf";
    fs::copy_file(oracle(shared, n), dir / n);
  }
}

// A tiny MoE GGUF whose layers disagree on the type of one role.
void write_inconsistent_model(const fs::path& path) {
  gguf::Writer w(32);
  w.add_kv("general.architecture", gguf::val::str("toy"));
  std::vector<std::vector<uint8_t>> data;
  auto add = [&](const std::string& name, uint32_t type, std::vector<uint64_t> ne, size_t nbytes) {
    w.add_tensor(name, type, ne);
    data.emplace_back(nbytes, uint8_t(data.size() + 1));
  };
  add("token_embd.weight", 0, {32, 8}, 32 * 8 * 4);
  add("blk.0.ffn_up_exps.weight", 0, {32, 16, 4}, 32 * 16 * 4 * 4);
  add("blk.0.ffn_down_exps.weight", 0, {16, 32, 4}, 16 * 32 * 4 * 4);
  add("blk.1.ffn_up_exps.weight", 1, {32, 16, 4}, 32 * 16 * 4 * 2);  // F16 here, F32 above
  add("blk.1.ffn_down_exps.weight", 0, {16, 32, 4}, 16 * 32 * 4 * 4);
  auto s = gguf::write_gguf(path.string(), w, data);
  REQUIRE_MESSAGE(s.ok(), s.error().message);
}

}  // namespace

TEST_CASE("round trip on the oracle models (MXFP4, Q2_K+Q3_K, F32, split set)") {
  std::optional<fs::path> shared;
  if (!shared_or_skip(shared)) return;
  TempDir tmp;
  for (const char* name : {"deepseek4-mxfp4.gguf", "kimi-k3-q2k-q3k.gguf", "deepseek4-f32.gguf", "kimi-k3-f32.gguf",
                           "kimi-k3-q2k-q3k-00002-of-00003.gguf"}) {
    fs::path out = tmp / (std::string(name) + ".out");
    build(oracle(*shared, name), out);
    check_round_trip(oracle(*shared, name), out);
  }
}

TEST_CASE("round trip on synthetic models (fused gate_up, dense layers, shards)") {
  TempDir tmp;
  struct Case {
    const char* name;
    const char* args;
  } cases[] = {
      {"ds4.gguf", "--arch deepseek4 --layers 3 --experts 6 --dense-layers 1"},
      {"kimi.gguf", "--arch kimi-k3 --layers 4 --experts 8"},
      {"fused.gguf", "--arch mixtral --layers 2 --experts 4 --fused-gate-up"},
  };
  for (const Case& c : cases) {
    fs::path model = synth(tmp / c.name, c.args);
    fs::path out = tmp / (std::string(c.name) + ".out");
    build(model, out, "--verify");
    check_round_trip(model, out);
  }
  auto fused = pack::PackReader::open((tmp / "fused.gguf.out").string() + ".xpack");
  REQUIRE(fused.ok());
  CHECK(fused->find_role("gate_up") >= 0);
  CHECK(fused->find_role("gate") < 0);
  auto ds4 = pack::PackReader::open((tmp / "ds4.gguf.out").string() + ".xpack");
  REQUIRE(ds4.ok());
  CHECK(ds4->layer_blocks() == std::vector<uint32_t>{1, 2});  // dense block 0 is absent
  CHECK_FALSE(ds4->layer_slot(0).has_value());

  // A split set: any shard names the set; the objects equal the single-file build's.
  synth(tmp / "sk.gguf", "--arch kimi-k3 --layers 4 --experts 8 --shards 3");
  fs::path shard2 = tmp / "sk-00002-of-00003.gguf";
  build(shard2, tmp / "sk-a");
  build(tmp / "sk-00003-of-00003.gguf", tmp / "sk-b");
  check_round_trip(shard2, tmp / "sk-a");
  CHECK(same_file(tmp / "sk-a.xpack", tmp / "sk-b.xpack"));
  auto split = read_file(tmp / "sk-a.xpack"), single = read_file(tmp / "kimi.gguf.out.xpack");
  auto ps = pack::PackReader::open((tmp / "sk-a.xpack").string());
  REQUIRE(ps.ok());
  CHECK(ps->shards().size() == 3);
  REQUIRE(split.size() == single.size());
  CHECK(std::equal(split.begin() + ps->data_start(), split.end(), single.begin() + ps->data_start()));
}

TEST_CASE("an interrupted build resumes to byte-identical output") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 4 --experts 8");
  fs::create_directories(tmp / "a");
  fs::create_directories(tmp / "b");
  build(model, tmp / "a" / "out");
  std::string o;
  // Crash twice, at different places (mid-layer and on a layer boundary), then finish.
  int rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out") + " --stop-after-objects 5", &o);
  CHECK(rc == 1);
  CHECK(o.find("stopped after") != std::string::npos);
  CHECK(fs::exists(tmp / "b" / "out.xpack.partial"));
  CHECK(fs::exists(tmp / "b" / "out.xpack.checkpoint"));
  CHECK_FALSE(fs::exists(tmp / "b" / "out.xpack"));
  rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out"), &o);
  CHECK(rc == 1);  // refuses to clobber an interrupted build without --resume/--force
  CHECK(o.find("--resume") != std::string::npos);
  rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out") +
               " --resume --stop-after-objects 16", &o);
  CHECK(rc == 1);
  rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out") + " --resume --json", &o);
  INFO(o);
  REQUIRE(rc == 0);
  auto j = nlohmann::json::parse(o);
  CHECK(j["resumed_from_object"].get<uint64_t>() > 0);
  CHECK(j["resumed_from_object"].get<uint64_t>() < j["n_objects"].get<uint64_t>());
  for (const char* f : {"out.xpack", "out.trunk.gguf", "out.xpack.json"})
    CHECK_MESSAGE(same_file(tmp / "a" / f, tmp / "b" / f), f);
  CHECK_FALSE(fs::exists(tmp / "b" / "out.xpack.checkpoint"));
  CHECK_FALSE(fs::exists(tmp / "b" / "out.xpack.partial"));

  // --resume of a finished build succeeds without work; a plain build needs --force.
  rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out") + " --resume --json", &o);
  CHECK(rc == 0);
  CHECK(nlohmann::json::parse(o)["copied_bytes"] == 0);
  rc = run(tool("xpack-build") + " " + q(other_model_for_resume(tmp)) + " -o " + q(tmp / "b" / "out") + " --resume", &o);
  CHECK(rc == 1);  // finished outputs of another source are not silently accepted
  rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out"), &o);
  CHECK(rc == 1);
  CHECK(o.find("--force") != std::string::npos);
  build(model, tmp / "b" / "out", "--force");
  CHECK(same_file(tmp / "a" / "out.xpack", tmp / "b" / "out.xpack"));
}

TEST_CASE("--consume-source deletes shards as they are done, also across a resume") {
  TempDir tmp;
  fs::create_directories(tmp / "ref");
  fs::create_directories(tmp / "src");
  fs::create_directories(tmp / "out");
  synth(tmp / "ref" / "m.gguf", "--arch kimi-k3 --layers 5 --experts 8 --shards 4");
  synth(tmp / "src" / "m.gguf", "--arch kimi-k3 --layers 5 --experts 8 --shards 4");
  fs::path first = tmp / "ref" / "m-00001-of-00004.gguf";
  build(first, tmp / "ref" / "out");

  std::string o;
  fs::path src_first = tmp / "src" / "m-00003-of-00004.gguf";
  int rc = run(tool("xpack-build") + " " + q(src_first) + " -o " + q(tmp / "out" / "out") +
                   " --consume-source --stop-after-objects 20",
               &o);
  INFO(o);
  CHECK(rc == 1);
  int left = 0;
  for (auto& e : fs::directory_iterator(tmp / "src")) left += e.path().extension() == ".gguf";
  CHECK(left < 4);  // something was consumed before the "crash"
  CHECK(left > 0);
  rc = run(tool("xpack-build") + " " + q(src_first) + " -o " + q(tmp / "out" / "out") +
               " --consume-source --resume --verify --json",
           &o);
  REQUIRE(rc == 0);
  auto j = nlohmann::json::parse(o);
  CHECK(j["verified"] == true);
  CHECK(fs::is_empty(tmp / "src"));
  CHECK(same_file(tmp / "ref" / "out.xpack", tmp / "out" / "out.xpack"));
  CHECK(same_file(tmp / "ref" / "out.trunk.gguf", tmp / "out" / "out.trunk.gguf"));
  auto p = pack::PackReader::open((tmp / "out" / "out.xpack").string(),
                                  pack::OpenOptions{(tmp / "out" / "out.trunk.gguf").string()});
  CHECK(p.ok());

  // --resume of the finished build is a no-op although its source is gone...
  rc = run(tool("xpack-build") + " " + q(src_first) + " -o " + q(tmp / "out" / "out") + " --consume-source --resume",
           &o);
  CHECK_MESSAGE(rc == 0, o);
  CHECK(same_file(tmp / "ref" / "out.xpack", tmp / "out" / "out.xpack"));
  // ...but another split set with shards on disk is still told apart.
  synth(tmp / "src" / "other.gguf", "--arch kimi-k3 --layers 4 --experts 8 --shards 4");
  rc = run(tool("xpack-build") + " " + q(tmp / "src" / "other-00001-of-00004.gguf") + " -o " +
               q(tmp / "out" / "out") + " --resume",
           &o);
  CHECK(rc == 1);
  CHECK(o.find("another source") != std::string::npos);

  // A single file: refused unless --force (the file must survive the refusal).
  fs::path single = synth(tmp / "single.gguf", "--arch deepseek4 --layers 2 --experts 4");
  rc = run(tool("xpack-build") + " " + q(single) + " -o " + q(tmp / "s1") + " --consume-source", &o);
  CHECK(rc == 1);
  CHECK(o.find("--force") != std::string::npos);
  CHECK(fs::exists(single));
  CHECK_FALSE(fs::exists(tmp / "s1.xpack"));
  build(single, tmp / "s2", "--consume-source --force");
  CHECK_FALSE(fs::exists(single));
  CHECK(pack::PackReader::open((tmp / "s2.xpack").string()).ok());
}

TEST_CASE("consume-source on the oracle split set leaves a pack equal to a normal build") {
  std::optional<fs::path> shared;
  if (!shared_or_skip(shared)) return;
  TempDir tmp;
  copy_split(*shared, tmp.path());
  build(oracle(*shared, "kimi-k3-q2k-q3k-00001-of-00003.gguf"), tmp / "ref");
  build(tmp / "kimi-k3-q2k-q3k-00001-of-00003.gguf", tmp / "eaten", "--consume-source");
  for (int k = 1; k <= 3; ++k)
    CHECK_FALSE(fs::exists(tmp / ("kimi-k3-q2k-q3k-0000" + std::to_string(k) + "-of-00003.gguf")));
  CHECK(same_file(tmp / "ref.xpack", tmp / "eaten.xpack"));
  CHECK(same_file(tmp / "ref.trunk.gguf", tmp / "eaten.trunk.gguf"));
}

TEST_CASE("xpack-inspect --verify names the damaged (layer, expert, role)") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 4 --experts 8");
  build(model, tmp / "p");
  fs::path pack_path = tmp / "p.xpack";
  std::string o;
  REQUIRE(run(tool("xpack-inspect") + " " + q(pack_path) + " --verify", &o) == 0);
  CHECK(o.find("OK") != std::string::npos);

  auto r = pack::PackReader::open(pack_path.string());
  REQUIRE(r.ok());
  const uint32_t slot = 1, expert = 5;
  const int down = r->find_role("down");
  REQUIRE(down >= 0);
  const uint32_t block = r->layer_blocks()[slot];
  uint64_t off = r->object_offset(slot, expert) + r->roles()[down].offset + 17;
  r = pack::PackReader::open(pack_path.string());  // close the old fd before editing
  auto bytes = read_file(pack_path);
  bytes[off] ^= 0x01;
  write_file(pack_path, bytes);

  int rc = run(tool("xpack-inspect") + " " + q(pack_path) + " --verify", &o);
  INFO(o);
  CHECK(rc == 1);
  std::string want = "layer " + std::to_string(block) + " (slot 1), expert 5, role down";
  CHECK(o.find(want) != std::string::npos);
  rc = run(tool("xpack-inspect") + " " + q(pack_path) + " --verify --json", &o);
  CHECK(rc == 1);
  // stdout holds the JSON object; stderr (merged by run_command) one error line.
  auto j = nlohmann::json::parse(o.substr(o.find('{'), o.rfind('}') - o.find('{') + 1));
  CHECK(j["verify"]["ok"] == false);
  CHECK(j["verify"]["layer"] == block);
  CHECK(j["verify"]["expert"] == 5);
  CHECK(j["verify"]["role"] == "down");
  // Without --verify the pack still opens: payload damage is found only by reading it.
  CHECK(run(tool("xpack-inspect") + " " + q(pack_path), &o) == 0);

  // The padding after a payload is documented as zeros: a non-zero byte there is found
  // too (no checksum covers it), once the payload damage above is undone.
  bytes[off] ^= 0x01;
  const uint64_t pad = r->object_offset(2, 3) + r->object_bytes();
  REQUIRE(pad < r->object_offset(2, 4));
  bytes[pad + 5] = 0x80;
  write_file(pack_path, bytes);
  rc = run(tool("xpack-inspect") + " " + q(pack_path) + " --verify", &o);
  CHECK(rc == 1);
  CHECK_MESSAGE(o.find("expert 3, role (padding after the payload)") != std::string::npos, o);
}

TEST_CASE("a damaged trunk tensor is found by --verify with the trunk, naming the tensor") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 3 --experts 4");
  build(model, tmp / "p");
  const fs::path pack_path = tmp / "p.xpack", trunk_path = tmp / "p.trunk.gguf";
  std::string o;
  REQUIRE(run(tool("xpack-inspect") + " " + q(pack_path) + " --verify --trunk " + q(trunk_path), &o) == 0);

  // One byte in the middle of each of a few tensors: every flip is found, by name.
  auto t = gguf::File::open(trunk_path.string());
  REQUIRE(t.ok());
  std::vector<std::pair<std::string, uint64_t>> targets;
  for (size_t i = 0; i < t->tensors().size(); i += std::max<size_t>(1, t->tensors().size() / 5))
    targets.emplace_back(t->tensors()[i].name, t->tensors()[i].file_offset + t->tensors()[i].nbytes / 2);
  t = gguf::File::open(trunk_path.string());  // close before editing
  const auto original = read_file(trunk_path);
  for (const auto& [name, off] : targets) {
    CAPTURE(name);
    auto bytes = original;
    bytes[off] ^= 0x10;
    write_file(trunk_path, bytes);
    int rc = run(tool("xpack-inspect") + " " + q(pack_path) + " --verify --trunk " + q(trunk_path), &o);
    CHECK(rc == 1);
    CHECK_MESSAGE(o.find("trunk tensor '" + name + "' is damaged") != std::string::npos, o);
    // PREFIX.trunk.gguf beside PREFIX.xpack is checked without --trunk too.
    CHECK(run(tool("xpack-inspect") + " " + q(pack_path) + " --verify", &o) == 1);
    CHECK(o.find("trunk tensor '" + name + "' is damaged") != std::string::npos);
    auto p = pack::PackReader::open(pack_path.string(), pack::OpenOptions{trunk_path.string()});
    REQUIRE(p.ok());  // opening checks identity, not the payload
    auto v = p->validate(pack::ValidateLevel::kChecksums);
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().code == XPACK_E_CHECKSUM);
  }
  write_file(trunk_path, original);
  CHECK(run(tool("xpack-inspect") + " " + q(pack_path) + " --verify --trunk " + q(trunk_path), &o) == 0);
}

TEST_CASE("xpack-inspect --json is enough to locate any expert without the C API") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 3 --experts 4");
  build(model, tmp / "p");
  std::string o;
  REQUIRE(run(tool("xpack-inspect") + " " + q(tmp / "p.xpack") + " --json", &o) == 0);
  auto j = nlohmann::json::parse(o);
  for (const char* k : {"format", "version", "arch", "data_start", "object_stride", "n_experts", "layers", "roles"})
    CHECK_MESSAGE(j.contains(k), k);
  CHECK(j["format"] == "xpack-expert-pack");
  CHECK(j["version"] == 1);
  CHECK(j["arch"] == "kimi-k3");
  auto src = gguf::Model::open(model.string());
  REQUIRE(src.ok());
  auto pack_bytes = read_file(tmp / "p.xpack");
  const uint64_t data_start = j["data_start"], stride = j["object_stride"], n_experts = j["n_experts"];
  std::vector<std::string> names;
  for (const auto& role : j["roles"]) names.push_back(role["name"]);
  CHECK(names == std::vector<std::string>{"gate", "up", "down"});
  for (size_t slot = 0; slot < j["layers"].size(); ++slot) {
    uint32_t block = j["layers"][slot];
    for (uint64_t e = 0; e < n_experts; ++e) {
      for (const auto& role : j["roles"]) {
        std::string tname = "blk." + std::to_string(block) + ".ffn_" + role["name"].get<std::string>() + "_exps.weight";
        const gguf::TensorInfo* t = src->find_tensor(tname);
        REQUIRE(t);
        uint64_t nbytes = role["nbytes"], off = data_start + (slot * n_experts + e) * stride + role["offset"].get<uint64_t>();
        REQUIRE(off + nbytes <= pack_bytes.size());
        auto data = src->tensor_data(*t);
        REQUIRE(data.ok());
        CHECK(std::memcmp(pack_bytes.data() + off, *data + e * nbytes, nbytes) == 0);
      }
    }
  }
}

TEST_CASE("bad input gives clear errors") {
  TempDir tmp;
  std::string o;
  CHECK(run(tool("xpack-build") + " --help", &o) == 0);
  CHECK(o.find("--consume-source") != std::string::npos);
  CHECK(run(tool("xpack-build"), &o) == 2);
  CHECK(run(tool("xpack-build") + " x.gguf", &o) == 2);  // no -o
  CHECK(run(tool("xpack-build") + " x.gguf -o y --bogus", &o) == 2);
  CHECK(run(tool("xpack-inspect"), &o) == 2);

  CHECK(run(tool("xpack-build") + " " + q(tmp / "missing.gguf") + " -o " + q(tmp / "x"), &o) == 1);
  CHECK(o.find("missing.gguf") != std::string::npos);

  // A model given where its pack belongs, and a pack where a GGUF belongs: the
  // message says what the file is and what to do.
  fs::path small = synth(tmp / "small.gguf", "--arch deepseek4 --layers 2 --experts 4");
  CHECK(run(tool("xpack-inspect") + " " + q(small), &o) == 1);
  CHECK_MESSAGE(o.find("is a GGUF model, not an Expert Pack; convert it first: xpack-build") != std::string::npos, o);
  build(small, tmp / "mp");
  CHECK(run(tool("xpack-build") + " " + q(tmp / "mp.xpack") + " -o " + q(tmp / "again"), &o) == 1);
  CHECK_MESSAGE(o.find("is an Expert Pack, not a GGUF") != std::string::npos, o);

  // Not a GGUF at all.
  write_file(tmp / "junk.gguf", std::vector<uint8_t>(100, 7));
  CHECK(run(tool("xpack-build") + " " + q(tmp / "junk.gguf") + " -o " + q(tmp / "x"), &o) == 1);

  // A dense model (no routed experts).
  fs::path dense = data_dir() / "stories260K.gguf";
  if (fs::exists(dense)) {
    CHECK(run(tool("xpack-build") + " " + q(dense) + " -o " + q(tmp / "x"), &o) == 1);
    CHECK(o.find("no routed expert tensors") != std::string::npos);
  } else {
    xpack::test::skip(xpack::test::Absent::kFixture, "dense-model case: test/data/stories260K.gguf is absent");
  }

  // Layers that disagree on a role's type: a documented limitation of format v1.
  write_inconsistent_model(tmp / "mixed.gguf");
  CHECK(run(tool("xpack-build") + " " + q(tmp / "mixed.gguf") + " -o " + q(tmp / "x"), &o) == 1);
  CHECK(o.find("format v1 needs identical expert types") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "x.xpack"));
  CHECK_FALSE(fs::exists(tmp / "x.xpack.partial"));

  // A truncated split set.
  synth(tmp / "sk.gguf", "--arch kimi-k3 --layers 3 --experts 4 --shards 2");
  fs::remove(tmp / "sk-00002-of-00002.gguf");
  CHECK(run(tool("xpack-build") + " " + q(tmp / "sk-00001-of-00002.gguf") + " -o " + q(tmp / "x"), &o) == 1);
  CHECK(o.find("missing") != std::string::npos);

  // A trunk is not a model to build from.
  fs::path model = synth(tmp / "m.gguf", "--arch deepseek4 --layers 2 --experts 4");
  build(model, tmp / "p");
  CHECK(run(tool("xpack-build") + " " + q(tmp / "p.trunk.gguf") + " -o " + q(tmp / "again"), &o) == 1);

  // Damaged packs through xpack-inspect.
  auto bytes = read_file(tmp / "p.xpack");
  write_file(tmp / "trunc.xpack", std::vector<uint8_t>(bytes.begin(), bytes.end() - 4096));
  CHECK(run(tool("xpack-inspect") + " " + q(tmp / "trunc.xpack"), &o) == 1);
  CHECK(o.find("header implies") != std::string::npos);
  auto hdr = bytes;
  hdr[100] ^= 0xFF;
  write_file(tmp / "hdr.xpack", hdr);
  CHECK(run(tool("xpack-inspect") + " " + q(tmp / "hdr.xpack"), &o) == 1);
  CHECK(o.find("checksum") != std::string::npos);
}

// The command-line conventions of tools/cli_app.h, as xpack-build and xpack-inspect apply them.
TEST_CASE("xpack-build / xpack-inspect: --version, --help lists every flag, --key=value") {
  std::string o;
  for (const char* t : {"xpack-build", "xpack-inspect"}) {
    CHECK(run(tool(t) + " --version", &o) == 0);
    CHECK(o == std::string(t) + " " + xpack_version() + "\n");
  }
  CHECK(run(tool("xpack-build") + " --help", &o) == 0);
  for (const char* flag : {"MODEL", "-o, --output", "--resume", "--verify", "--consume-source", "--force",
                           "--buffer-mib", "--json", "-h, --help", "--version", "K, M, G, T suffixes, binary",
                           "exit status: 0 success, 1 failure, 2 usage error"})
    CHECK_MESSAGE(o.find(flag) != std::string::npos, flag);
  // Test hooks stay out of --help (they are accepted: the resume tests use them).
  for (const char* hook : {"--stop-after-objects", "--assume-free-bytes", "--checkpoint-mib"})
    CHECK_MESSAGE(o.find(hook) == std::string::npos, hook);
  CHECK(run(tool("xpack-inspect") + " --help", &o) == 0);
  for (const char* flag : {"PACK", "--json", "--verify", "--trunk", "-h, --help", "--version",
                           "exit status: 0 all well, 1 damaged/unreadable pack, 2 usage error"})
    CHECK_MESSAGE(o.find(flag) != std::string::npos, flag);

  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch deepseek4 --layers 2 --experts 4");
  REQUIRE(run(tool("xpack-build") + " " + q(model) + " --output=" + q(tmp / "a") + " --buffer-mib=1M --json", &o) == 0);
  build(model, tmp / "b", "--buffer-mib 1");
  CHECK(same_file(tmp / "a.xpack", tmp / "b.xpack"));
  CHECK(run(tool("xpack-inspect") + " " + q(tmp / "a.xpack") + " --trunk=" + q(tmp / "a.trunk.gguf") + " --verify",
            &o) == 0);
  CHECK(o.find("belongs to this pack") != std::string::npos);
  CHECK(run(tool("xpack-inspect") + " " + q(tmp / "a.xpack") + " --trunk=" + q(model) + " --json", &o) == 0);
}

TEST_CASE("xpack-build / xpack-inspect: usage errors exit 2 with one line naming the flag") {
  const std::string m = "m.gguf -o out";  // never read: every case fails while parsing
  struct Case {
    std::string tool, args, says;
  };
  const Case cases[] = {
      {"xpack-build", m + " --bogus", "unknown option --bogus"},
      {"xpack-build", m + " --bogus=3", "unknown option --bogus"},
      {"xpack-build", m + " second.gguf", "unexpected argument 'second.gguf'"},
      {"xpack-build", "", "MODEL is required"},
      {"xpack-build", "m.gguf", "--output is required"},
      {"xpack-build", "m.gguf -o", "--output needs a value"},
      {"xpack-build", m + " --buffer-mib x", "--buffer-mib: expected a size such as 4096, 64K, 1M or 2G, got 'x'"},
      {"xpack-build", m + " --buffer-mib 0", "--buffer-mib: 0 is out of range (1M..1T)"},
      {"xpack-build", m + " --buffer-mib 2T", "--buffer-mib: 2T is out of range (1M..1T)"},
      {"xpack-build", m + " --buffer-mib=1048577", "--buffer-mib: 1048577 is out of range (1M..1T)"},
      {"xpack-build", m + " --buffer-mib 1536K", "--buffer-mib: 1536K is not a whole number of MiB"},
      {"xpack-build", m + " --buffer-mib 1.5G", "--buffer-mib: expected a size"},
      {"xpack-build", m + " --buffer-mib 99999999999T", "--buffer-mib: 99999999999T is too large"},
      {"xpack-build", m + " --stop-after-objects 1K", "--stop-after-objects: expected a whole number, got '1K'"},
      {"xpack-build", m + " --assume-free-bytes lots", "--assume-free-bytes: expected a size"},
      {"xpack-build", m + " --json=maybe", "--json: 'maybe' is not a valid value"},
      {"xpack-inspect", "", "PACK is required"},
      {"xpack-inspect", "a.xpack b.xpack", "unexpected argument 'b.xpack'"},
      {"xpack-inspect", "a.xpack --bogus", "unknown option --bogus"},
      {"xpack-inspect", "a.xpack --trunk", "--trunk needs a value"},
  };
  for (const auto& c : cases) {
    std::string o;
    INFO(c.tool << " " << c.args);
    CHECK(run(tool(c.tool) + " " + c.args, &o) == 2);
    INFO(o);
    CHECK(o.find(c.says) != std::string::npos);
    CHECK(o.find("run with --help") != std::string::npos);
    CHECK(std::count(o.begin(), o.end(), '\n') == 1);
  }
}

TEST_CASE("free space is checked before anything is written") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch deepseek4 --layers 2 --experts 4");
  std::string o;
  int rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "p") + " --assume-free-bytes 4096", &o);
  INFO(o);
  CHECK(rc == 1);
  CHECK(o.find("not enough free space") != std::string::npos);
  CHECK(o.find("4096 bytes") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "p.xpack.partial"));
  CHECK_FALSE(fs::exists(tmp / "p.xpack.checkpoint"));
  build(model, tmp / "p", "--assume-free-bytes 1000000000000");

  // A size takes binary suffixes: 4K is 4096 bytes (too little), 1T is plenty.
  rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "s") + " --assume-free-bytes=4K", &o);
  CHECK(rc == 1);
  CHECK(o.find("4096 bytes") != std::string::npos);
  build(model, tmp / "s", "--assume-free-bytes 1T --buffer-mib 2M");
}

TEST_CASE("a filesystem that reports no size at all (ramfs) is not taken for a full one") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch deepseek4 --layers 2 --experts 4");
  fs::create_directories(tmp / "ram");
  if (run("mount -t ramfs ramfs " + q(tmp / "ram") + " 2>/dev/null") != 0) {
    xpack::test::skip(xpack::test::Absent::kCapability, "cannot mount a ramfs here (needs root)");
    return;
  }
  std::string o;
  int rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "ram" / "p"), &o);
  CHECK_MESSAGE(rc == 0, o);
  CHECK(fs::exists(tmp / "ram" / "p.xpack"));
  run("umount " + q(tmp / "ram"));
}

TEST_CASE("a build killed with SIGKILL at a random moment resumes to identical output") {
  TempDir tmp;
  // ~100 MB, small buffers and frequent checkpoints so the kill lands mid-build.
  fs::path model = synth(tmp / "m.gguf", "--arch deepseek4 --layers 4 --experts 16 --embd 1024 --ff 1024");
  fs::create_directories(tmp / "a");
  fs::create_directories(tmp / "b");
  build(model, tmp / "a" / "out");
  const std::string cmd = tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "b" / "out") +
                          " --buffer-mib 4 --checkpoint-mib 4";
  bool interrupted = false;
  for (const char* delay : {"0.05", "0.15", "0.3"}) {
    std::string o;
    run("(" + cmd + " --resume & pid=$!; sleep " + delay + "; kill -9 $pid; wait $pid) >/dev/null 2>&1", &o);
    interrupted |= fs::exists(tmp / "b" / "out.xpack.checkpoint");
  }
  if (!interrupted) MESSAGE("note: every kill came after the build finished (fast disk); resume path not hit");
  std::string o;
  int rc = run(cmd + " --resume --json", &o);
  INFO(o);
  REQUIRE(rc == 0);
  for (const char* f : {"out.xpack", "out.trunk.gguf", "out.xpack.json"})
    CHECK_MESSAGE(same_file(tmp / "a" / f, tmp / "b" / f), f);
}

TEST_CASE("the manifest describes the pack like xpack-inspect --json") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 3 --experts 4");
  build(model, tmp / "p");
  auto m = nlohmann::json::parse(read_file_string(tmp / "p.xpack.json"));
  std::string o;
  REQUIRE(run(tool("xpack-inspect") + " " + q(tmp / "p.xpack") + " --json", &o) == 0);
  auto j = nlohmann::json::parse(o);
  for (const char* k : {"format", "version", "arch", "file_size", "data_start", "object_stride", "object_bytes",
                        "n_experts", "n_experts_used", "layers", "roles", "payload_bytes", "padding_bytes",
                        "source_identity", "source_shards"})
    CHECK_MESSAGE(m[k] == j[k], k);
  CHECK(m["pack_file"] == "p.xpack");
  CHECK(m["trunk_file"] == "p.trunk.gguf");
  CHECK(m["source_files"][0] == "m.gguf");
  CHECK(m["file_size"].get<uint64_t>() == fs::file_size(tmp / "p.xpack"));
}

TEST_CASE("progress bar on a terminal, quiet otherwise") {
  TempDir tmp;
  fs::path model = synth(tmp / "m.gguf", "--arch deepseek4 --layers 2 --experts 4");
  std::string o;
  // Not a terminal (run_command pipes stderr): no bar.
  REQUIRE(run(tool("xpack-build") + " " + q(model) + " -o " + q(tmp / "p1"), &o) == 0);
  CHECK(o.find("ETA") == std::string::npos);
  if (run("command -v script >/dev/null") != 0) {
    xpack::test::skip(xpack::test::Absent::kFixture, "tty half: util-linux 'script' is not installed");
    return;
  }
  REQUIRE(run("script -qec " + q(tool("xpack-build") + " " + model.string() + " -o " + (tmp / "p2").string()) +
                  " /dev/null",
              &o) == 0);
  CHECK(o.find("ETA") != std::string::npos);
  CHECK(o.find("/s") != std::string::npos);
  REQUIRE(run("script -qec " + q(tool("xpack-build") + " " + model.string() + " -o " + (tmp / "p3").string() +
                                 " --json") + " /dev/null",
              &o) == 0);
  CHECK(o.find("ETA") == std::string::npos);
  CHECK(o.find("throughput_mib_s") != std::string::npos);
}

TEST_CASE("consumed shards are closed, so their space is really freed during the build") {
  TempDir tmp;
  synth(tmp / "m.gguf", "--arch kimi-k3 --layers 5 --experts 8 --shards 4");
  pack::BuildOptions opts;
  opts.source = (tmp / "m-00001-of-00004.gguf").string();
  opts.out = (tmp / "out").string();
  opts.consume_source = true;
  opts.buffer_bytes = 1 << 20;  // many batches, many progress calls
  int open_deleted = 0, calls = 0;
  opts.progress = [&](const pack::BuildProgress& p) {
    if (std::string(p.phase) != "experts") return;
    ++calls;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      std::string target = fs::read_symlink(e.path(), ec).string();
      if (!ec && target.find(tmp.path().string()) == 0 && target.find("(deleted)") != std::string::npos)
        ++open_deleted;
    }
  };
  auto r = pack::build_pack(opts);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(calls > 3);
  CHECK(r->consumed.size() == 4);
  CHECK(open_deleted == 0);
}
