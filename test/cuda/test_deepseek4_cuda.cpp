// xpack-run --device cuda on deepseek4 against the CPU backend: the oracle
// models (F32 and MXFP4 experts) teacher-forced on both prompts, greedy decode
// through the sliding-window / compressed-KV / indexer state on the GPU (equal
// to one batch on the GPU, the CPU's greedy ids), the pack path streamed through
// a CUDA expert cache smaller than a layer (bit-identical to resident and to the
// plain GGUF), and random-weight variants that move every shape and layer
// pattern (hc 3, one Sinkhorn pass, all-CSA, HCA between window-only layers).
// Without a CUDA device every case is skipped (exit 77); without ../shared/oracle
// or the gguf Python package the cases that need them are.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "gpu_harness.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

using xpack::test::gpu::max_abs_diff;
using xpack::test::gpu::OracleRun;
using xpack::test::gpu::load_run;
using xpack::test::gpu::run_logits;
using xpack::test::gpu::batch_logits;
using xpack::test::gpu::decode;

namespace {

constexpr size_t kVocab = 512;       // the oracle and variant models' vocabulary
constexpr double kTolCpu = 1e-3;     // CUDA vs CPU logits, per value
constexpr double kTolDecode = 1e-4;  // decode vs batch on CUDA (as the CPU test asks of the CPU)

std::optional<fs::path> oracle_dir() {
  auto o = oracle_dir_with("deepseek4-f32.gguf");
  if (!o) xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (deepseek4 models) not found");
  return o;
}

const char* kModels[] = {"deepseek4-f32.gguf", "deepseek4-mxfp4.gguf"};
const char* kRefs[] = {"deepseek4-f32", "deepseek4-mxfp4-deq"};

// xpack-build SRC -o PREFIX (exit 0 REQUIREd): xpack-run's arguments for the pack.
std::string packed(const fs::path& src, const fs::path& prefix) {
  RunResult b = run(q(xpack_build_exe()) + " " + q(src) + " -o " + q(prefix));
  INFO(b.out << b.err);
  REQUIRE(b.rc == 0);
  return "-m " + q(prefix.string() + ".trunk.gguf") + " --pack " + q(prefix.string() + ".xpack");
}

}  // namespace

TEST_CASE("deepseek4 on CUDA: teacher-forced logits within 1e-3 of the CPU (F32 and MXFP4, both prompts)") {
  if (!xpack::test::gpu::available()) return;
  auto oracle = oracle_dir();
  if (!oracle) return;
  xpack::test::TempDir tmp;
  for (int m = 0; m < 2; ++m) {
    for (const std::string prompt : {"short", "long"}) {
      const std::string model = kModels[m];
      CAPTURE(model);
      CAPTURE(prompt);
      const std::vector<int32_t> ids = load_run(*oracle, std::string(kRefs[m]) + "." + prompt).all();
      const std::string args = "-m " + q(*oracle / "models" / model);
      const auto gpu = batch_logits(args + " --device cuda", ids, tmp / "cuda.f32", kVocab);
      const auto cpu = batch_logits(args + " --device cpu", ids, tmp / "cpu.f32", kVocab);
      const double d = max_abs_diff(gpu, cpu);
      MESSAGE(model << " " << prompt << " (" << ids.size() << " rows, one batch): CUDA vs CPU max|diff| " << d);
      CHECK(d <= kTolCpu);
    }
  }
}

TEST_CASE("deepseek4 on CUDA: greedy decode through the compressed-KV state equals one batch and the CPU's ids") {
  if (!xpack::test::gpu::available()) return;
  auto oracle = oracle_dir();
  if (!oracle) return;
  xpack::test::TempDir tmp;
  for (int m = 0; m < 2; ++m) {
    for (const std::string prompt : {"short", "long"}) {
      const std::string model = kModels[m];
      CAPTURE(model);
      CAPTURE(prompt);
      const OracleRun o = load_run(*oracle, std::string(kRefs[m]) + "." + prompt);
      const std::string args = "-m " + q(*oracle / "models" / model);
      std::vector<float> gpu, cpu;
      const auto gpu_ids = decode(args + " --device cuda", o.prompt, o.gen.size(), tmp / "cuda.f32", &gpu, kVocab);
      const auto cpu_ids = decode(args + " --device cpu", o.prompt, o.gen.size(), tmp / "cpu.f32", &cpu, kVocab);
      CHECK(gpu_ids == cpu_ids);
      std::vector<int32_t> all = o.prompt;
      all.insert(all.end(), gpu_ids.begin(), gpu_ids.end());
      const double d_batch = max_abs_diff(gpu, batch_logits(args + " --device cuda", all, tmp / "batch.f32", kVocab));
      const double d_cpu = max_abs_diff(gpu, cpu);
      MESSAGE(model << " " << prompt << ": CUDA decode vs CUDA batch max|diff| " << d_batch << ", vs CPU decode "
                    << d_cpu << ", greedy ids " << std::string(gpu_ids == cpu_ids ? "equal" : "DIFFER"));
      CHECK(d_batch <= kTolDecode);
      CHECK(d_cpu <= kTolCpu);
    }
  }
  // From one token, 300 single-token steps: every 4:1 block, the indexer's
  // top-k once more than top_k blocks exist and the 128:1 blocks at positions
  // 127 and 255 are completed in decode.
  const std::string args = "-m " + q(*oracle / "models" / "deepseek4-f32.gguf");
  std::vector<float> gpu, cpu;
  const auto gpu_ids = decode(args + " --device cuda", {1}, 300, tmp / "cuda.f32", &gpu, kVocab);
  const auto cpu_ids = decode(args + " --device cpu", {1}, 300, tmp / "cpu.f32", &cpu, kVocab);
  CHECK(gpu_ids == cpu_ids);
  std::vector<int32_t> all = {1};
  all.insert(all.end(), gpu_ids.begin(), gpu_ids.end());
  const double d_batch = max_abs_diff(gpu, batch_logits(args + " --device cuda", all, tmp / "batch.f32", kVocab));
  const double d_cpu = max_abs_diff(gpu, cpu);
  MESSAGE("300 steps from position 0: CUDA decode vs CUDA batch max|diff| " << d_batch << ", vs CPU " << d_cpu
                                                                           << ", greedy ids "
                                                                           << std::string(gpu_ids == cpu_ids ? "equal" : "DIFFER"));
  CHECK(d_batch <= kTolDecode);
  CHECK(d_cpu <= kTolCpu);
}

TEST_CASE("deepseek4 on CUDA: the pack streamed through a CUDA cache = resident = plain GGUF, bit for bit") {
  if (!xpack::test::gpu::available()) return;
  auto oracle = oracle_dir();
  if (!oracle) return;
  xpack::test::TempDir tmp;
  for (int m = 0; m < 2; ++m) {
    const std::string model = kModels[m];
    CAPTURE(model);
    const fs::path src = *oracle / "models" / model;
    const std::string pack = packed(src, tmp / ("pack" + std::to_string(m)));
    const std::vector<int32_t> ids = load_run(*oracle, std::string(kRefs[m]) + ".long").all();
    const std::string tail = " --prompt-ids " + join_ids(ids) + " -n 0";
    std::vector<float> streamed, resident, plain, cpu;
    // 0.25 MiB is below one layer's experts even for MXFP4: objects are evicted and read again.
    json s = run_logits(pack + " --cache-mib 0.25 --device cuda" + tail, tmp / "s.f32", &streamed);
    json r = run_logits(pack + " --cache-mib 64 --device cuda" + tail, tmp / "r.f32", &resident);
    run_logits("-m " + q(src) + " --device cuda" + tail, tmp / "p.f32", &plain);
    run_logits(pack + " --cache-mib 0.25 --device cpu" + tail, tmp / "c.f32", &cpu);
    CHECK(s["backend"] == "cuda");
    CHECK(s["counters"]["source"] == "pack-cache");
    CHECK(s["counters"]["cache_evictions"].get<uint64_t>() > 0);
    CHECK(r["counters"]["cache_evictions"].get<uint64_t>() == 0);
    CHECK(xpack::test::read_file(tmp / "s.f32") == xpack::test::read_file(tmp / "r.f32"));
    CHECK(xpack::test::read_file(tmp / "s.f32") == xpack::test::read_file(tmp / "p.f32"));
    const double d = max_abs_diff(streamed, cpu);
    MESSAGE(model << " long, pack streamed on CUDA (" << s["counters"]["cache_evictions"] << " evictions): vs CPU "
                  << "max|diff| " << d);
    CHECK(d <= kTolCpu);
  }
}

TEST_CASE("deepseek4 on CUDA: decode replayed as CUDA graphs = launched kernel by kernel, streamed and resident") {
  if (!xpack::test::gpu::available()) return;
  auto oracle = oracle_dir();
  if (!oracle) return;
  xpack::test::TempDir tmp;
  for (int m = 0; m < 2; ++m) {
    const std::string model = kModels[m];
    CAPTURE(model);
    const std::string pack = packed(*oracle / "models" / model, tmp / ("pack" + std::to_string(m))) + " --device cuda";
    // 140 steps: 4:1 blocks complete every fourth step and the 128:1 one at
    // position 127, so the stretches change shape and the KV caches grow.
    const OracleRun o = load_run(*oracle, std::string(kRefs[m]) + ".short");
    const std::string tail = " --prompt-ids " + join_ids(o.prompt) + " -n 140 --ignore-eos";
    const char* names[] = {"streamed, graphs", "streamed, kernel by kernel", "resident, graphs",
                           "resident, kernel by kernel"};
    const std::string runs[] = {pack + " --cache-mib 0.25 --cuda-graphs", pack + " --cache-mib 0.25",
                                pack + " --cache-mib 64 --cuda-graphs", pack + " --cache-mib 64"};
    std::vector<float> logits[4];
    json j[4];
    for (int r = 0; r < 4; ++r) j[r] = run_logits(runs[r] + tail, tmp / ("g" + std::to_string(r) + ".f32"), &logits[r]);
    for (int r = 1; r < 4; ++r) {
      INFO(names[r] << " against " << names[0]);
      CHECK(xpack::test::read_file(tmp / ("g" + std::to_string(r) + ".f32")) == xpack::test::read_file(tmp / "g0.f32"));
    }
    CHECK(j[0]["counters"]["cache_evictions"].get<uint64_t>() > 0);
    for (int r : {0, 2}) {
      INFO(names[r] << ": " << j[r]["cuda_graphs"].dump());
      // Most stretches replay an executable kept from an earlier step.
      CHECK(j[r]["cuda_graphs"]["launches"].get<int64_t>() >= 140);
      CHECK(j[r]["cuda_graphs"]["updates"].get<int64_t>() > j[r]["cuda_graphs"]["instantiations"].get<int64_t>());
    }
    for (int r : {1, 3}) CHECK(j[r]["cuda_graphs"]["launches"].get<int64_t>() == 0);
    // The host's wait for the GPU: within each phase's own time (the run's router
    // ids and logits are downloaded every step, so a decode waits at least once).
    for (int r = 0; r < 4; ++r) {
      INFO(names[r] << ": " << j[r]["cuda_host_wait"].dump());
      const double wp = j[r]["cuda_host_wait"]["prefill_s"].get<double>(), wd = j[r]["cuda_host_wait"]["decode_s"].get<double>();
      CHECK(wp >= 0.0);
      CHECK(wp <= j[r]["prefill_s"].get<double>());
      CHECK(wd > 0.0);
      CHECK(wd <= j[r]["decode_s"].get<double>());
    }
    MESSAGE(model << ": graphs " << j[0]["cuda_graphs"].dump() << " streamed, " << j[2]["cuda_graphs"].dump()
                  << " resident; logits identical");
  }
}

TEST_CASE("deepseek4 on CUDA: other shapes and layer patterns agree with the CPU") {
  if (!xpack::test::gpu::available()) return;
  auto vocab = stories260k();
  if (!vocab) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf (tokenizer for the variant models) not found");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  // test_deepseek4.cpp's variants (checked there against the float64 reference on the CPU).
  int i = 0;
  for (const Deepseek4Variant& v : deepseek4_variants()) {
    const std::string what = v.what;
    CAPTURE(what);
    const fs::path model = tmp / ("variant" + std::to_string(i++) + ".gguf");
    RunResult g = write_deepseek4_variant(v, *vocab, model);
    INFO(g.out << g.err);
    REQUIRE(g.rc == 0);
    const std::string args = "-m " + q(model);
    std::vector<float> gpu, cpu;
    const auto gpu_ids = decode(args + " --device cuda", {1}, 159, tmp / "cuda.f32", &gpu, kVocab);
    const auto cpu_ids = decode(args + " --device cpu", {1}, 159, tmp / "cpu.f32", &cpu, kVocab);
    CHECK(gpu_ids == cpu_ids);
    std::vector<int32_t> all = {1};
    all.insert(all.end(), gpu_ids.begin(), gpu_ids.end());
    const auto gpu_batch = batch_logits(args + " --device cuda", all, tmp / "batch.f32", kVocab);
    const auto cpu_batch = batch_logits(args + " --device cpu", all, tmp / "cpu_batch.f32", kVocab);
    const double d_decode = max_abs_diff(gpu, gpu_batch), d_cpu = max_abs_diff(gpu_batch, cpu_batch);
    MESSAGE(what << ": CUDA decode vs CUDA batch " << d_decode << ", CUDA batch vs CPU batch " << d_cpu
                 << ", CUDA decode vs CPU decode " << max_abs_diff(gpu, cpu));
    CHECK(d_decode <= kTolDecode);
    CHECK(d_cpu <= kTolCpu);
  }
}

TEST_CASE("deepseek4 on CUDA: more than 8 hyper-connection copies are refused, naming the limit") {
  if (!xpack::test::gpu::available()) return;
  auto vocab = stories260k();
  if (!vocab) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf (tokenizer for the variant models) not found");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  const fs::path model = tmp / "hc9.gguf";
  RunResult g = run("python3 " + q(source_root() / "test" / "runtime" / "deepseek4_variant.py") + " " + q(model) +
                    " --vocab-from " + q(*vocab) + " --hp " + q(R"({"hc": 9})"));
  INFO(g.out << g.err);
  REQUIRE(g.rc == 0);
  RunResult r = run(q(xpack_run_exe()) + " -m " + q(model) + " --device cuda --prompt-ids 1,2 -n 0");
  CHECK(r.rc != 0);
  CHECK(r.err.find("at most 8 copies") != std::string::npos);
  RunResult c = run(q(xpack_run_exe()) + " -m " + q(model) + " --device cpu --prompt-ids 1,2 -n 0");
  INFO(c.err);
  CHECK(c.rc == 0);  // the CPU has no such limit
}
