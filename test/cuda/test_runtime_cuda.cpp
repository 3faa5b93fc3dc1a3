// xpack-run --device cuda end to end, against the CPU backend and llama.cpp:
// stories260K gives llama.cpp's 60 greedy ids and logits within 1e-3 of the
// CPU's (decode, and the whole sequence as one batch through the GEMM path);
// the Mixtral-form MoE fixture streamed through a 4-slot CUDA expert cache gives
// the dense model's ids, bit-identical to the resident cache and to the plain
// GGUF's uploaded experts, within 1e-3 of the CPU. Without a CUDA device every
// case is skipped (exit 77).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "gpu_harness.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

using xpack::test::gpu::max_abs_diff;

namespace {

constexpr double kTol = 1e-3;  // CUDA vs CPU logits, per value

std::string xrun(const std::string& args) { return q(xpack_run_exe()) + " " + args; }

std::vector<int32_t> golden_ids() {
  std::ifstream f(xpack::test::data_dir() / "stories260K.once.json");
  REQUIRE(f.good());
  return json::parse(f)["gen_ids"].get<std::vector<int32_t>>();
}

json run_json(const std::string& args, std::string* err = nullptr) {
  RunResult r = run(xrun(args + " --json"));
  INFO(args << "\n" << r.err);
  REQUIRE(r.rc == 0);
  if (err) *err = r.err;
  return json::parse(r.out);
}

}  // namespace

TEST_CASE("stories260K on CUDA: llama.cpp's 60 greedy ids, logits within 1e-3 of the CPU") {
  if (!xpack::test::gpu::available()) return;
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  xpack::test::TempDir tmp;
  const std::vector<int32_t> want = golden_ids();
  REQUIRE(want.size() == 60);
  std::string err;
  json g = run_json("-m " + q(*model) + " --prompt-ids 1,403 -n 60 --device cuda --logits-out " + q(tmp / "cuda.f32"),
                    &err);
  json c = run_json("-m " + q(*model) + " --prompt-ids 1,403 -n 60 --device cpu --logits-out " + q(tmp / "cpu.f32"));
  CHECK(g["backend"] == "cuda");
  CHECK(err.find("VRAM plan") != std::string::npos);
  CHECK(g["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(c["gen_ids"].get<std::vector<int32_t>>() == want);
  const std::vector<float> lg = read_f32(tmp / "cuda.f32"), lc = read_f32(tmp / "cpu.f32");
  CHECK(lg.size() == size_t(62) * 512);
  const double d = max_abs_diff(lg, lc);
  MESSAGE("stories260K decode: CUDA vs CPU logits max |diff| = " << d);
  CHECK(d <= kTol);

  // The same 62 tokens as one batch (more than 8 tokens: dequantized tiles and
  // SGEMM instead of matvec) against the CPU's decode rows.
  std::vector<int32_t> seq = {1, 403};
  seq.insert(seq.end(), want.begin(), want.end());
  run_json("-m " + q(*model) + " --prompt-ids " + join_ids(seq) + " -n 0 --device cuda --logits-out " +
           q(tmp / "batch.f32"));
  const double db = max_abs_diff(read_f32(tmp / "batch.f32"), lc);
  MESSAGE("stories260K one batch of 62: CUDA vs CPU decode logits max |diff| = " << db);
  CHECK(db <= kTol);
}

// The Mixtral-form MoE fixture (make_moe_fixture.py on stories260K) and its
// pack in `dir`; false (the skip recorded) where stories260K or gguf-py is absent.
bool build_moe_fixture(const std::filesystem::path& dir) {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return false;
  }
  std::string why;
  if (!xpack::test::have_python_gguf(&why)) {
    xpack::test::skip(xpack::test::Absent::kFixture, why);
    return false;
  }
  RunResult r = run("python3 " + q(source_root() / "test" / "runtime" / "make_moe_fixture.py") + " " + q(*model) +
                    " " + q(dir / "moe.gguf"));
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  r = run(q(xpack_build_exe()) + " " + q(dir / "moe.gguf") + " -o " + q(dir / "moe"));
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  return true;
}

TEST_CASE("MoE fixture on CUDA: streamed through 4 device slots = resident = plain GGUF, the dense model's ids") {
  if (!xpack::test::gpu::available()) return;
  xpack::test::TempDir tmp;
  if (!build_moe_fixture(tmp.path())) return;
  const std::string trunk = q(tmp / "moe.trunk.gguf"), pack = q(tmp / "moe.xpack");
  const std::string args = " --prompt-ids 1,403 -n 60 ";
  const std::vector<int32_t> want = golden_ids();

  // 0.2 MiB = 4 objects of 48 KiB: one layer's experts, so every layer streams.
  std::string err;
  json s = run_json("-m " + trunk + " --pack " + pack + args + "--cache-mib 0.2 --device cuda --logits-out " +
                        q(tmp / "streamed.f32"),
                    &err);
  json r = run_json("-m " + trunk + " --pack " + pack + args + "--cache-mib 64 --device cuda --logits-out " +
                    q(tmp / "resident.f32"));
  json p = run_json("-m " + q(tmp / "moe.gguf") + args + "--device cuda --logits-out " + q(tmp / "plain.f32"));
  json c = run_json("-m " + trunk + " --pack " + pack + args + "--cache-mib 0.2 --device cpu --logits-out " +
                    q(tmp / "cpu.f32"));
  CHECK(s["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(r["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(p["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(s["backend"] == "cuda");
  CHECK(s["counters"]["source"] == "pack-cache");
  CHECK(s["counters"]["budget_objects"].get<uint64_t>() == 4);
  CHECK(s["counters"]["cache_evictions"].get<uint64_t>() > 0);
  CHECK(s["counters"]["cache_misses"].get<uint64_t>() > 20 * 10);
  CHECK(r["counters"]["cache_misses"].get<uint64_t>() == 20);
  CHECK(err.find("VRAM plan") != std::string::npos);
  CHECK(err.find("expert cache 0.00 MiB") == std::string::npos);  // the slots are in VRAM

  const auto sb = xpack::test::read_file(tmp / "streamed.f32");
  CHECK(sb.size() == size_t(62) * 512 * 4);
  CHECK(sb == xpack::test::read_file(tmp / "resident.f32"));
  CHECK(sb == xpack::test::read_file(tmp / "plain.f32"));
  const double d = max_abs_diff(read_f32(tmp / "streamed.f32"), read_f32(tmp / "cpu.f32"));
  MESSAGE("MoE fixture streamed: CUDA vs CPU logits max |diff| = " << d);
  CHECK(d <= kTol);

  // The direct reader's buffers are host memory: refused on CUDA, clearly.
  RunResult dr = run(xrun("-m " + trunk + " --pack " + pack + args + "--expert-reader direct --device cuda"));
  CHECK(dr.rc == 1);
  CHECK(dr.err.find("not implemented on CUDA") != std::string::npos);
}

TEST_CASE("MoE fixture on CUDA: the default cache takes the free VRAM, capped at the pack; too little is refused") {
  if (!xpack::test::gpu::available()) return;
  xpack::test::TempDir tmp;
  if (!build_moe_fixture(tmp.path())) return;
  const std::string base = "-m " + q(tmp / "moe.trunk.gguf") + " --pack " + q(tmp / "moe.xpack") +
                           " --prompt-ids 1,403 -n 8 --device cuda";
  // No --cache-mib: all free VRAM minus the reserve, which on any GPU that
  // runs this test holds the whole pack; the cache never takes more slots than
  // the pack has objects (the same count an explicit 64 MiB gets).
  std::string err;
  json d = run_json(base, &err);
  json r = run_json(base + " --cache-mib 64");
  CHECK(d["counters"]["budget_objects"].get<uint64_t>() == r["counters"]["budget_objects"].get<uint64_t>());
  CHECK(d["counters"]["cache_evictions"].get<uint64_t>() == 0);
  CHECK(d["gen_ids"] == r["gen_ids"]);
  CHECK(err.find("VRAM plan") != std::string::npos);

  // A reserve larger than the GPU leaves no room for one layer's top-k: refused
  // at start-up naming the working set and the flag, before any token.
  RunResult big = run(xrun(base + " --cache-reserve-mib 100000000"));
  CHECK(big.rc == 1);
  CHECK(big.err.find("working set of top-k") != std::string::npos);
  CHECK(big.err.find("--cache-reserve-mib") != std::string::npos);
  CHECK(big.out.empty());
  // So is an explicit budget of one object (the fixture's top-k is 4).
  RunResult one = run(xrun(base + " --cache-mib 0.05"));
  CHECK(one.rc == 1);
  CHECK(one.err.find("working set of top-k") != std::string::npos);
  CHECK(one.err.find("in --cache-mib 0.05") != std::string::npos);
}
