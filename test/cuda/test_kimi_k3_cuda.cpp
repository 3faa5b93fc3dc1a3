// xpack-run --device cuda on kimi-k3 against the CPU backend (which
// test/runtime/test_kimi_k3.cpp checks against llama.cpp): the oracle models
// (F32, and Q2_K/Q3_K experts with Q8_0 trunk as the 3-shard set) teacher-forced
// on both prompts, greedy decode through the KDA state and the MLA cache on the
// GPU (equal to one batch on the GPU and to the CPU's ids), the pack streamed
// through a CUDA expert cache smaller than a layer (bit-identical to resident
// and to the plain GGUF), and the hyperparameter variants of kimi_k3_mutate.py
// (softplus gate, residual attention off / every layer / every 3rd, top-3).
//
// The models: $XPACK_KIMI_FIXTURE_DIR (a folder with models/ and logits/ as in
// ../shared/oracle, for machines without ../shared), else ../shared/oracle.
// Without a CUDA device every case is skipped (exit 77); without the models, or
// (variants only) the gguf Python package, the cases that need them are.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

constexpr size_t kVocab = 512;       // the oracle models' vocabulary
constexpr double kTolCpu = 1e-3;     // CUDA vs CPU logits, per value
constexpr double kTolDecode = 1e-4;  // decode vs batch on CUDA (as test_kimi_k3.cpp asks of the CPU)

constexpr const char* kF32 = "kimi-k3-f32.gguf";
constexpr const char* kShards = "kimi-k3-q2k-q3k-00001-of-00003.gguf";

// The folder holding models/ and logits/.
std::optional<fs::path> fixture_dir() {
  if (const char* env = std::getenv("XPACK_KIMI_FIXTURE_DIR"); env && *env) {
    const fs::path d = env;
    if (fs::exists(d / "models" / kF32) && fs::exists(d / "models" / kShards)) return d;
    xpack::test::skip(xpack::test::Absent::kFixture, "XPACK_KIMI_FIXTURE_DIR=" + d.string() + " lacks models/" +
                                                         kF32 + " or models/" + kShards);
    return std::nullopt;
  }
  auto o = oracle_dir_with(kF32);
  if (!o || !fs::exists(*o / "models" / kShards)) {
    xpack::test::skip(xpack::test::Absent::kFixture,
                      std::string("../shared/oracle/models/") + kF32 + " or " + kShards + " not found");
    return std::nullopt;
  }
  return o;
}

struct Model {
  const char* file;
  const char* ref;  // the oracle run whose ids are fed
};
const Model kModels[] = {{kF32, "kimi-k3-f32"}, {kShards, "kimi-k3-q2k-q3k-deq"}};

}  // namespace

TEST_CASE("kimi-k3 on CUDA: teacher-forced logits within 1e-3 of the CPU (F32, Q2_K/Q3_K shards, both prompts)") {
  if (!xpack::test::gpu::available()) return;
  auto dir = fixture_dir();
  if (!dir) return;
  xpack::test::TempDir tmp;
  for (const Model& m : kModels) {
    for (const std::string prompt : {"short", "long"}) {
      const std::string model = m.file;
      CAPTURE(model);
      CAPTURE(prompt);
      const std::vector<int32_t> ids = load_run(*dir, std::string(m.ref) + "." + prompt).all();
      const std::string args = "-m " + q(*dir / "models" / model);
      const auto gpu = batch_logits(args + " --device cuda", ids, tmp / "cuda.f32", kVocab);
      const auto cpu = batch_logits(args + " --device cpu", ids, tmp / "cpu.f32", kVocab);
      const double d = max_abs_diff(gpu, cpu);
      MESSAGE(model << " " << prompt << " (" << ids.size() << " rows, one batch): CUDA vs CPU max|diff| " << d);
      CHECK(d <= kTolCpu);
    }
  }
}

TEST_CASE("kimi-k3 on CUDA: greedy decode through the KDA/MLA state equals one batch and the CPU's ids") {
  if (!xpack::test::gpu::available()) return;
  auto dir = fixture_dir();
  if (!dir) return;
  xpack::test::TempDir tmp;
  for (const Model& m : kModels) {
    for (const std::string prompt : {"short", "long"}) {
      const std::string model = m.file;
      CAPTURE(model);
      CAPTURE(prompt);
      const OracleRun o = load_run(*dir, std::string(m.ref) + "." + prompt);
      const std::string args = "-m " + q(*dir / "models" / model);
      std::vector<float> gpu, cpu;
      const auto gpu_ids = decode(args + " --device cuda", o.prompt, o.gen.size(), tmp / "cuda.f32", &gpu, kVocab);
      const auto cpu_ids = decode(args + " --device cpu", o.prompt, o.gen.size(), tmp / "cpu.f32", &cpu, kVocab);
      CHECK(gpu_ids == cpu_ids);
      // llama.cpp's own greedy ids (the F32 model's run is the greedy one; the
      // dequantized reference's ids were chosen by another model)
      if (std::string(m.file) == kF32) CHECK(gpu_ids == o.gen);
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
}

TEST_CASE("kimi-k3 on CUDA: the pack streamed through a small CUDA cache = resident = plain GGUF, bit for bit") {
  if (!xpack::test::gpu::available()) return;
  auto dir = fixture_dir();
  if (!dir) return;
  xpack::test::TempDir tmp;
  // Below one layer's 8 experts (F32: 0.75 MiB each; Q2_K/Q3_K: about 70 KiB)
  // and above top-2: objects are evicted and read again.
  const char* small[] = {"4", "0.25"};
  int i = 0;
  for (const Model& m : kModels) {
    const std::string model = m.file;
    CAPTURE(model);
    const fs::path src = *dir / "models" / model;
    const fs::path prefix = tmp / ("pack" + std::to_string(i));
    RunResult b = run(q(xpack_build_exe()) + " " + q(src) + " -o " + q(prefix));
    INFO(b.out << b.err);
    REQUIRE(b.rc == 0);
    const std::string pack = "-m " + q(prefix.string() + ".trunk.gguf") + " --pack " + q(prefix.string() + ".xpack");
    const OracleRun o = load_run(*dir, std::string(m.ref) + ".long");
    for (const bool decoding : {false, true}) {
      CAPTURE(decoding);
      // teacher-forced on every id, or greedy decode from the prompt
      const std::string tail = decoding ? " --prompt-ids " + join_ids(o.prompt) + " -n " +
                                              std::to_string(o.gen.size()) + " --ignore-eos"
                                        : " --prompt-ids " + join_ids(o.all()) + " -n 0";
      const std::string cache = std::string(" --cache-mib ") + small[i];
      std::vector<float> streamed, resident, plain, cpu;
      json s = run_logits(pack + cache + " --device cuda" + tail, tmp / "s.f32", &streamed);
      json r = run_logits(pack + " --cache-mib 64 --device cuda" + tail, tmp / "r.f32", &resident);
      run_logits("-m " + q(src) + " --device cuda" + tail, tmp / "p.f32", &plain);
      run_logits(pack + cache + " --device cpu" + tail, tmp / "c.f32", &cpu);
      CHECK(s["backend"] == "cuda");
      CHECK(s["counters"]["source"] == "pack-cache");
      CHECK(s["counters"]["cache_evictions"].get<uint64_t>() > 0);
      CHECK(r["counters"]["cache_evictions"].get<uint64_t>() == 0);
      CHECK(xpack::test::read_file(tmp / "s.f32") == xpack::test::read_file(tmp / "r.f32"));
      CHECK(xpack::test::read_file(tmp / "s.f32") == xpack::test::read_file(tmp / "p.f32"));
      const double d = max_abs_diff(streamed, cpu);
      MESSAGE(model << " long" << std::string(decoding ? " decoded" : " teacher-forced") << ", pack streamed on CUDA through "
                    << std::string(small[i]) << " MiB (" << s["counters"]["cache_evictions"] << " evictions): vs CPU max|diff| "
                    << d);
      CHECK(d <= kTolCpu);
    }
    ++i;
  }
}

// Registered as its own Meson test (cuda_kimi_k3_variants): it needs the gguf
// Python package and numpy, which a GPU machine may lack.
TEST_CASE("kimi-k3 on CUDA variants: other hyperparameters agree with the CPU and decode like the batch") {
  if (!xpack::test::gpu::available()) return;
  auto dir = fixture_dir();
  if (!dir) return;
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  const fs::path src = *dir / "models" / kF32;
  const fs::path mutate = source_root() / "test" / "runtime" / "kimi_k3_mutate.py";
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 400, 428, 395};
  const size_t n_gen = 6;
  int i = 0;
  for (const char* change : {"--drop-key kimi-k3.kda.gate_lower_bound", "--set-int kimi-k3.attn_res.block_size=0",
                             "--set-int kimi-k3.attn_res.block_size=1", "--set-int kimi-k3.attn_res.block_size=3",
                             "--set-int kimi-k3.expert_used_count=3"}) {
    const std::string what = change;
    CAPTURE(what);
    const fs::path model = tmp / ("v" + std::to_string(i++) + ".gguf");
    RunResult m = run("python3 " + q(mutate) + " " + q(src) + " " + q(model) + " " + change);
    INFO(m.out << m.err);
    REQUIRE_MESSAGE(m.rc == 0, "kimi_k3_mutate.py failed (needs python3 with numpy and gguf)");
    const std::string args = "-m " + q(model);
    std::vector<float> gpu, cpu;
    const auto gpu_ids = decode(args + " --device cuda", prompt, n_gen, tmp / "cuda.f32", &gpu, kVocab);
    const auto cpu_ids = decode(args + " --device cpu", prompt, n_gen, tmp / "cpu.f32", &cpu, kVocab);
    CHECK(gpu_ids == cpu_ids);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gpu_ids.begin(), gpu_ids.end());
    const auto gpu_batch = batch_logits(args + " --device cuda", all, tmp / "batch.f32", kVocab);
    const auto cpu_batch = batch_logits(args + " --device cpu", all, tmp / "cpu_batch.f32", kVocab);
    const double d_decode = max_abs_diff(gpu, gpu_batch), d_cpu = max_abs_diff(gpu_batch, cpu_batch);
    MESSAGE(what << ": CUDA decode vs CUDA batch " << d_decode << ", CUDA batch vs CPU batch " << d_cpu);
    CHECK(d_decode <= kTolDecode);
    CHECK(d_cpu <= kTolCpu);
  }
}
