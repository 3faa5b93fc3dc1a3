// The real-weights MoE fixture (stories260K split into 4 experts, test-models.md
// section 3) through xpack-build and the pack path: the same greedy ids as the
// dense model, logits bit-identical whether experts stream through a tiny cache,
// stay resident, or come straight from the GGUF; a split source works too.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

std::string xrun(const std::string& args) { return q(xpack_run_exe()) + " " + args; }

std::vector<int32_t> golden_ids() {
  std::ifstream f(xpack::test::data_dir() / "stories260K.once.json");
  REQUIRE(f.good());
  return json::parse(f)["gen_ids"].get<std::vector<int32_t>>();
}

// stories260K.gguf when the fixture can be made from it (gguf-py importable);
// otherwise the test case is recorded as skipped and nullopt returned.
std::optional<fs::path> fixture_source() {
  auto model = stories260k();
  std::string why;
  if (!model) why = "stories260K.gguf not found";
  else if (!xpack::test::have_python_gguf(&why)) model.reset();
  if (!model) xpack::test::skip(xpack::test::Absent::kFixture, why);
  return model;
}

// Writes the fixture with test/runtime/make_moe_fixture.py (gguf-py).
void make_fixture(const fs::path& model, const fs::path& out, const std::string& extra = "") {
  RunResult r = run("python3 " + q(source_root() / "test" / "runtime" / "make_moe_fixture.py") + " " + q(model) +
                    " " + q(out) + " " + extra);
  INFO(r.out << r.err);
  REQUIRE_MESSAGE(r.rc == 0, "make_moe_fixture.py failed (needs python3 with numpy and gguf)");
}

void build_pack(const fs::path& src, const fs::path& out_prefix) {
  RunResult r = run(q(xpack_build_exe()) + " " + q(src) + " -o " + q(out_prefix));
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  REQUIRE(fs::exists(out_prefix.string() + ".xpack"));
  REQUIRE(fs::exists(out_prefix.string() + ".trunk.gguf"));
}

// The fixture NAME.gguf in `dir` (make_fixture's `extra` flags) and its pack NAME.xpack +
// NAME.trunk.gguf beside it.
void packed_fixture(const fs::path& model, const fs::path& dir, const std::string& name,
                    const std::string& extra = "") {
  make_fixture(model, dir / (name + ".gguf"), extra);
  build_pack(dir / (name + ".gguf"), dir / name);
}

// xpack-run's arguments that stream pack NAME in `dir` through a cache of
// `cache_mib` MiB for 60 tokens after the prompt 1,403 (end with a space).
std::string streamed(const fs::path& dir, const std::string& name, const std::string& cache_mib) {
  return "-m " + q(dir / (name + ".trunk.gguf")) + " --pack " + q(dir / (name + ".xpack")) +
         " --prompt-ids 1,403 -n 60 --cache-mib " + cache_mib + " ";
}

// xpack-run `args` exits with `rc` and says `says` on stderr.
void check_refused(const std::string& args, int rc, const std::string& says) {
  RunResult r = run(xrun(args));
  CAPTURE(args);
  CHECK(r.rc == rc);
  CHECK_MESSAGE(r.err.find(says) != std::string::npos, r.err);
}

json run_json(const std::string& args) {
  RunResult r = run(xrun(args + " --json"));
  INFO(args << "\n" << r.err);
  REQUIRE(r.rc == 0);
  return json::parse(r.out);
}

}  // namespace

TEST_CASE("MoE fixture: pack streamed / resident / plain GGUF all give the dense model's ids") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  packed_fixture(*model, tmp.path(), "moe");
  const std::string trunk = q(tmp / "moe.trunk.gguf"), pack = q(tmp / "moe.xpack");
  const std::vector<int32_t> want = golden_ids();

  // One object = gate + up + down of 64x64 F32 = 48 KiB; 0.2 MiB holds four,
  // exactly one layer's worth, so every layer of every step streams.
  json streamed = run_json("-m " + trunk + " --pack " + pack + " --prompt-ids 1,403 -n 60 --cache-mib 0.2 " +
                           "--logits-out " + q(tmp / "streamed.f32"));
  json resident = run_json("-m " + trunk + " --pack " + pack + " --prompt-ids 1,403 -n 60 --cache-mib 64 " +
                           "--logits-out " + q(tmp / "resident.f32"));
  json plain = run_json("-m " + q(tmp / "moe.gguf") + " --prompt-ids 1,403 -n 60 --logits-out " +
                        q(tmp / "plain.f32"));
  json direct = run_json("-m " + trunk + " --pack " + pack + " --prompt-ids 1,403 -n 60 --cache-mib 0.2 " +
                         "--expert-reader direct --logits-out " + q(tmp / "direct.f32"));
  CHECK(streamed["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(resident["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(plain["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(direct["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(streamed["expert_source"] == "pack");
  CHECK(streamed["counters"]["source"] == "pack-cache");  // libxpack's expert cache
  CHECK(direct["counters"]["source"] == "pack-direct");
  CHECK(plain["expert_source"] == "gguf");

  const auto s = xpack::test::read_file(tmp / "streamed.f32");
  CHECK(s.size() == (2 + 60) * 512 * 4);
  CHECK(s == xpack::test::read_file(tmp / "resident.f32"));
  CHECK(s == xpack::test::read_file(tmp / "plain.f32"));
  CHECK(s == xpack::test::read_file(tmp / "direct.f32"));

  // Resident: each of the 5 x 4 objects read once. Streamed: read again and again.
  const json& rc = resident["counters"];
  const json& sc = streamed["counters"];
  CHECK(rc["cache_misses"].get<uint64_t>() == 20);
  CHECK(rc["cache_evictions"].get<uint64_t>() == 0);
  CHECK(sc["cache_misses"].get<uint64_t>() > 20 * 10);
  CHECK(sc["cache_evictions"].get<uint64_t>() > 0);
  CHECK(sc["pack_read_bytes"].get<uint64_t>() == sc["cache_misses"].get<uint64_t>() * sc["object_bytes"].get<uint64_t>());
  CHECK(sc["budget_objects"].get<uint64_t>() == 4);
  CHECK(direct["counters"]["cache_misses"].get<uint64_t>() > 20 * 10);
  // Prefill (2 tokens, 5 layers) misses each layer's 4 objects once at most; decode's are the rest.
  const json& sp = streamed["counters_prefill"];
  CHECK(sp["cache_misses"].get<uint64_t>() > 0);
  CHECK(sp["cache_misses"].get<uint64_t>() <= 20);
  CHECK(sp["pack_read_bytes"].get<uint64_t>() < sc["pack_read_bytes"].get<uint64_t>());
  CHECK(plain["counters_prefill"].contains("acquire_calls"));

  // --preload-experts: all 20 objects read at start-up, none while a token runs, same output.
  json preloaded = run_json("-m " + trunk + " --pack " + pack + " --prompt-ids 1,403 -n 60 --cache-mib 64 " +
                            "--preload-experts --logits-out " + q(tmp / "preloaded.f32"));
  CHECK(preloaded["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(xpack::test::read_file(tmp / "preloaded.f32") == s);
  CHECK(preloaded["counters_prefill"]["cache_misses"].get<uint64_t>() == 20);
  CHECK(preloaded["counters"]["cache_misses"].get<uint64_t>() == 20);
  CHECK(preloaded["counters"]["cache_evictions"].get<uint64_t>() == 0);
  // A cache that cannot hold them all is an error that says what to do, not a quiet stream.
  RunResult small = run(xrun("-m " + trunk + " --pack " + pack + " --prompt-ids 1,403 -n 2 --cache-mib 0.2 --preload-experts"));
  CHECK(small.rc == 1);
  CHECK(small.err.find("--preload-experts: the expert cache cannot hold all 20 experts") != std::string::npos);
}

TEST_CASE("MoE fixture: a host tier serves the streamed run's misses with copies, same logits") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  packed_fixture(*model, tmp.path(), "moe");
  const std::string base = streamed(tmp.path(), "moe", "0.2");
  // 4 slots of 48 KiB and a 1 MiB tier (capped at the other 16 objects + the
  // spare): every object is read once, every later miss is a copy from the tier.
  json tiered = run_json(base + "--host-cache-mib 1 --logits-out " + q(tmp / "tiered.f32"));
  json flat = run_json(base + "--logits-out " + q(tmp / "flat.f32"));
  CHECK(tiered["gen_ids"].get<std::vector<int32_t>>() == golden_ids());
  CHECK(xpack::test::read_file(tmp / "tiered.f32") == xpack::test::read_file(tmp / "flat.f32"));
  const json& tc = tiered["counters"];
  CHECK(tc["host_frames"].get<uint64_t>() == 17);
  CHECK(tc["pack_reads"].get<uint64_t>() == 20);
  CHECK(tc["host_hits"].get<uint64_t>() == tc["cache_misses"].get<uint64_t>() - 20);
  CHECK(tc["host_hits"].get<uint64_t>() > 20 * 10);
  CHECK(tc["host_demotions"].get<uint64_t>() == tc["cache_evictions"].get<uint64_t>());
  CHECK(flat["counters"]["host_frames"].get<uint64_t>() == 0);  // none on the CPU by default
  CHECK(flat["counters"]["host_hits"].get<uint64_t>() == 0);
  CHECK(flat["counters"]["pack_reads"].get<uint64_t>() == flat["counters"]["cache_misses"].get<uint64_t>());
  // The plan on stderr says what the cache took (capped at the objects beyond the slots).
  RunResult said = run(xrun(base + "-n 1 --host-cache-mib 1"));
  CHECK(said.rc == 0);
  CHECK(said.err.find("host tier: 16 experts in 1 MiB of pinned host memory") != std::string::npos);
  // Refusals say what to do: less than two objects; more than the machine has.
  check_refused(base + "-n 1 --host-cache-mib 0.05", 1, "--host-cache-mib: the expert cache could not be created");
  check_refused(base + "-n 1 --host-cache-mib 0.05", 1, "fewer than 2");
  check_refused(base + "-n 1 --host-cache-mib 900000000", 1, "of host memory available");
  check_refused(base + "-n 1 --host-cache-mib -3", 2, "--host-cache-mib");
}

TEST_CASE("MoE fixture: --no-overlap, --cache-policy, --read-splits and --queue-depth change when experts compute and which stay, not the logits") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  packed_fixture(*model, tmp.path(), "moe");
  // 6 slots of 48 KiB for 20 objects: every step misses.
  const std::string base = streamed(tmp.path(), "moe", "0.3");
  json plain = run_json(base + "--logits-out " + q(tmp / "plain.f32"));
  const auto want = xpack::test::read_file(tmp / "plain.f32");
  CHECK(plain["gen_ids"].get<std::vector<int32_t>>() == golden_ids());
  CHECK(plain["counters"]["cache_policy"] == "adaptive");
  CHECK(plain["counters"]["overlap"] == true);

  json serial = run_json(base + "--no-overlap --logits-out " + q(tmp / "serial.f32"));
  CHECK(xpack::test::read_file(tmp / "serial.f32") == want);
  CHECK(serial["counters"]["overlap"] == false);
  // The same requests in the same order: the same hits and reads.
  CHECK(serial["counters"]["cache_misses"] == plain["counters"]["cache_misses"]);
  CHECK(serial["counters"]["pack_reads"] == plain["counters"]["pack_reads"]);

  for (const char* policy : {"lru", "lfu", "hybrid", "decay"}) {
    CAPTURE(policy);
    const fs::path out = tmp / (std::string(policy) + ".f32");
    json r = run_json(base + "--cache-policy " + policy + " --logits-out " + q(out));
    CHECK(xpack::test::read_file(out) == want);
    // The name comes from the cache itself (xpack_cache_get_info): it runs that policy.
    CHECK(r["counters"]["cache_policy"] == policy);
  }

  // Each expert read whole with 64 reads in flight (libxpack's defaults), or as 4 ranges
  // with 2 in flight: when the bytes land changes, not what they are.
  for (const char* io : {"--read-splits 1 --queue-depth 64", "--read-splits 4 --queue-depth 2"}) {
    CAPTURE(io);
    json split = run_json(base + io + " --logits-out " + q(tmp / "split.f32"));
    CHECK(xpack::test::read_file(tmp / "split.f32") == want);
    CHECK(split["counters"]["pack_reads"] == plain["counters"]["pack_reads"]);
    CHECK(split["counters"]["io_errors"] == 0);
  }

  // They apply to the expert cache only, and the CLI admits only its policies.
  check_refused("-m " + q(tmp / "moe.gguf") + " --prompt-ids 1,403 -n 1 --no-overlap", 2, "--no-overlap needs --pack");
  check_refused("-m " + q(tmp / "moe.gguf") + " --prompt-ids 1,403 -n 1 --read-splits 4", 2,
                "--read-splits needs --pack");
  check_refused(base + "-n 1 --expert-reader direct --queue-depth 8", 2,
                "--queue-depth needs --pack and --expert-reader cache");
  check_refused(base + "-n 1 --read-splits 0", 2, "--read-splits");
  check_refused(base + "-n 1 --read-splits 257", 2, "--read-splits");
  check_refused(base + "-n 1 --queue-depth 4097", 2, "--queue-depth");
  check_refused(base + "-n 1 --expert-reader direct --cache-policy lru", 2,
                "--cache-policy needs --pack and --expert-reader cache");
  check_refused(base + "-n 1 --cache-policy belady", 2, "--cache-policy");
}

TEST_CASE("MoE fixture: a pack where O_DIRECT is refused fails closed unless --allow-buffered-io") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  fs::create_directories(tmp / "ram");
  // ramfs refuses O_DIRECT on every kernel (tmpfs accepts it since Linux 6.6).
  if (run("mount -t ramfs ramfs " + q(tmp / "ram") + " 2>/dev/null").rc != 0) {
    xpack::test::skip(xpack::test::Absent::kCapability, "cannot mount a ramfs here (needs root)");
    return;
  }
  make_fixture(*model, tmp / "moe.gguf");
  build_pack(tmp / "moe.gguf", tmp / "ram" / "moe");
  const std::string args = "-m " + q(tmp / "ram" / "moe.trunk.gguf") + " --pack " + q(tmp / "ram" / "moe.xpack") +
                           " --prompt-ids 1,403 -n 8 --cache-mib 0.2";
  RunResult refused = run(xrun(args));
  CHECK(refused.rc == 1);
  CHECK_MESSAGE(refused.err.find("refuses O_DIRECT") != std::string::npos, refused.err);
  CHECK(refused.err.find("--allow-buffered-io") != std::string::npos);
  RunResult allowed = run(xrun(args + " --allow-buffered-io --json"));
  CHECK_MESSAGE(allowed.rc == 0, allowed.err);
  CHECK(allowed.err.find("warning") != std::string::npos);
  if (allowed.rc == 0) {
    const json j = json::parse(allowed.out);
    const std::vector<int32_t> want = golden_ids();
    CHECK(j["gen_ids"].get<std::vector<int32_t>>() == std::vector<int32_t>(want.begin(), want.begin() + 8));
    CHECK(j["counters"]["fallback_count"].get<uint64_t>() > 0);
  }
  run("umount " + q(tmp / "ram"));
}

TEST_CASE("MoE fixture: a converted trunk without --pack, a foreign pack, a damaged pack") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  packed_fixture(*model, tmp.path(), "moe");

  // The trunk has routers but no expert tensors: say what is missing.
  RunResult r = run(xrun("-m " + q(tmp / "moe.trunk.gguf") + " --prompt-ids 1,403 -n 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("ffn_gate_exps") != std::string::npos);
  CHECK(r.err.find("--pack") != std::string::npos);

  // A pack built from another model (top-2 random router) does not belong to this trunk.
  packed_fixture(*model, tmp.path(), "other", "--used 2 --router random");
  r = run(xrun("-m " + q(tmp / "moe.trunk.gguf") + " --pack " + q(tmp / "other.xpack") + " --prompt-ids 1,403 -n 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("other.xpack") != std::string::npos);

  // Flip one payload byte of the last object: it is refused by default (both readers),
  // and used only when checking is switched off.
  std::vector<uint8_t> bytes = xpack::test::read_file(tmp / "moe.xpack");
  bytes[bytes.size() - 4096 * 2 - 17] ^= 0x40;
  xpack::test::write_file(tmp / "bad.xpack", bytes);
  for (const char* reader : {"cache", "direct"}) {
    CAPTURE(reader);
    r = run(xrun("-m " + q(tmp / "moe.trunk.gguf") + " --pack " + q(tmp / "bad.xpack") +
                 " --expert-reader " + reader + " --prompt-ids 1,403 -n 4"));
    CHECK(r.rc == 1);
    CHECK(r.err.find("expert") != std::string::npos);
    r = run(xrun("-m " + q(tmp / "moe.trunk.gguf") + " --pack " + q(tmp / "bad.xpack") + " --expert-reader " +
                 reader + " --no-verify-experts --prompt-ids 1,403 -n 4"));
    CHECK_MESSAGE(r.rc == 0, r.err);
  }
}

TEST_CASE("MoE fixture top-2: pack path and plain GGUF path agree bit for bit; split source") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  packed_fixture(*model, tmp.path(), "top2", "--used 2 --router random");
  json a = run_json("-m " + q(tmp / "top2.trunk.gguf") + " --pack " + q(tmp / "top2.xpack") +
                    " --prompt-ids 1,403,407,261 -n 30 --cache-mib 0.1 --logits-out " + q(tmp / "a.f32"));
  json b = run_json("-m " + q(tmp / "top2.gguf") + " --prompt-ids 1,403,407,261 -n 30 --logits-out " + q(tmp / "b.f32"));
  CHECK(a["gen_ids"] == b["gen_ids"]);
  CHECK(xpack::test::read_file(tmp / "a.f32") == xpack::test::read_file(tmp / "b.f32"));

  // The same model as a gguf-split set: any shard opens the whole set.
  make_fixture(*model, tmp / "split.gguf", "--used 2 --router random --split-max-tensors 20");
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(tmp.path()))
    if (e.path().filename().string().rfind("split-0000", 0) == 0) shards.push_back(e.path());
  REQUIRE(shards.size() >= 2);
  for (const auto& shard : shards) {
    json c = run_json("-m " + q(shard) + " --prompt-ids 1,403,407,261 -n 30 --logits-out " + q(tmp / "c.f32"));
    CHECK(c["gen_ids"] == b["gen_ids"]);
    CHECK(xpack::test::read_file(tmp / "c.f32") == xpack::test::read_file(tmp / "b.f32"));
  }
  build_pack(shards.back(), tmp / "fromsplit");
  json d = run_json("-m " + q(tmp / "fromsplit.trunk.gguf") + " --pack " + q(tmp / "fromsplit.xpack") +
                    " --prompt-ids 1,403,407,261 -n 30 --cache-mib 0.1 --logits-out " + q(tmp / "d.f32"));
  CHECK(d["gen_ids"] == b["gen_ids"]);
  CHECK(xpack::test::read_file(tmp / "d.f32") == xpack::test::read_file(tmp / "b.f32"));
}

namespace {

// Max |diff| between xpack-run's logits for `ids` and llama_ref.py's float64 forward pass.
float diff_vs_reference(const std::string& model_args, const fs::path& model_file, const std::vector<int32_t>& ids,
                        const xpack::test::TempDir& tmp, std::string* ref_note, json* run_out = nullptr) {
  RunResult ref = run("python3 " + q(source_root() / "test" / "runtime" / "llama_ref.py") + " " + q(model_file) +
                      " --ids " + join_ids(ids) + " --out " + q(tmp / "ref.f32"));
  INFO(ref.out << ref.err);
  REQUIRE(ref.rc == 0);
  *ref_note = ref.out;
  RunResult x = run(xrun(model_args + " --prompt-ids " + join_ids(ids) + " -n 0 --json --logits-out " + q(tmp / "x.f32")));
  INFO(x.err);
  REQUIRE(x.rc == 0);
  if (run_out) *run_out = json::parse(x.out);
  std::vector<float> a = read_f32(tmp / "ref.f32"), b = read_f32(tmp / "x.f32");
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == ids.size() * 512);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST_CASE("llama against an independent float64 reference: dense, and MoE top-2 through a 2-slot cache") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  std::vector<int32_t> ids = {1, 403};
  for (int32_t id : golden_ids()) ids.push_back(id);
  ids.resize(40);
  std::string note;
  float dense = diff_vs_reference("-m " + q(*model), *model, ids, tmp, &note);
  CHECK(dense <= 1e-4f);

  packed_fixture(*model, tmp.path(), "top2", "--used 2 --router random");
  json moe_run;
  float moe = diff_vs_reference("-m " + q(tmp / "top2.trunk.gguf") + " --pack " + q(tmp / "top2.xpack") +
                                    " --cache-mib 0.1",
                                tmp / "top2.gguf", ids, tmp, &note, &moe_run);
  // Two slots, up to four distinct experts per layer in a 40-token prefill: the
  // request streams through the slots (deferred experts) without changing routing.
  CHECK(moe_run["counters"]["budget_objects"].get<uint64_t>() == 2);
  CHECK(moe_run["counters"]["deferred_experts"].get<uint64_t>() > 0);
  // The comparison only means something if no routing decision is a near tie.
  double margin = std::stod(note.substr(note.find("margin") + 7));
  CHECK(margin > 1e-3);
  CHECK(moe <= 1e-4f);
  MESSAGE("max |diff| vs float64 reference: dense " << dense << ", MoE top-2 " << moe << "; " << note);
}

TEST_CASE("MoE fixture with fused ffn_gate_up_exps: pack and plain GGUF give the dense ids") {
  auto model = fixture_source();
  if (!model) return;
  xpack::test::TempDir tmp;
  packed_fixture(*model, tmp.path(), "fused", "--fused");
  json a = run_json("-m " + q(tmp / "fused.trunk.gguf") + " --pack " + q(tmp / "fused.xpack") +
                    " --prompt-ids 1,403 -n 60 --cache-mib 0.2 --logits-out " + q(tmp / "a.f32"));
  json b = run_json("-m " + q(tmp / "fused.gguf") + " --prompt-ids 1,403 -n 60 --logits-out " + q(tmp / "b.f32"));
  CHECK(a["gen_ids"].get<std::vector<int32_t>>() == golden_ids());
  CHECK(b["gen_ids"].get<std::vector<int32_t>>() == golden_ids());
  CHECK(xpack::test::read_file(tmp / "a.f32") == xpack::test::read_file(tmp / "b.f32"));
}
