// Kimi-K3's unabsorbed MLA weight attn_kv_b (models/kimi_k3/mla.cpp splits it per
// head into the absorbed attn_k_b / attn_v_b at load) against llama.cpp's own
// attn_kv_b graph: the oracle's kimi-k3-f32 model rewritten with attn_kv_b
// (kimi_k3_kv_b.py, at test time) must give llama.cpp's logits in
// test/data/kimi-k3-kv-b on every row, the same greedy ids, and the absorbed
// model's own logits, also through a pack; a wrongly shaped attn_kv_b is
// refused naming the tensor.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

constexpr int kVocab = 512;  // the oracle models' vocabulary (MANIFEST.md)
constexpr double kTol = 1e-3;

fs::path reference_dir() { return source_root() / "test" / "data" / "kimi-k3-kv-b"; }


std::vector<float> run_logits(const fs::path& model, const std::vector<int32_t>& ids, int n_gen,
                              const fs::path& out) {
  RunResult r = run(q(xpack_run_exe()) + " -m " + q(model) + " -t 2 --prompt-ids " + join_ids(ids) + " -n " +
                    std::to_string(n_gen) + " --ignore-eos --logits-out " + q(out));
  REQUIRE_MESSAGE(r.rc == 0, model << "\n" << r.out << r.err);
  return read_f32(out);
}

// Greedy ids from a decode's logits: argmax of the row before each generated
// token, ties to the lowest id (as llama_logits.cpp chooses).
std::vector<int32_t> greedy_ids(const std::vector<float>& rows, size_t n_prompt, size_t n_gen) {
  std::vector<int32_t> ids;
  for (size_t k = 0; k < n_gen; ++k) {
    const float* row = &rows[(n_prompt - 1 + k) * kVocab];
    ids.push_back(static_cast<int32_t>(std::max_element(row, row + kVocab) - row));
  }
  return ids;
}

// The variant written by kimi_k3_kv_b.py (ARGS: its options).
fs::path make_variant(const fs::path& src, const fs::path& out, const std::string& args = "") {
  const fs::path gen = source_root() / "test" / "runtime" / "kimi_k3_kv_b.py";
  RunResult m = run("python3 " + q(gen) + " " + q(src) + " " + q(out) + " " + args);
  REQUIRE_MESSAGE(m.rc == 0, "kimi_k3_kv_b.py failed (needs python3 with numpy and gguf): " << m.out << m.err);
  return out;
}

}  // namespace

TEST_CASE("kimi-k3 attn_kv_b: every row within 1e-3 of llama.cpp's attn_kv_b graph, the same greedy ids") {
  auto oracle = oracle_dir_with("kimi-k3-f32.gguf");
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3-f32.gguf) not found");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  const fs::path absorbed = *oracle / "models" / "kimi-k3-f32.gguf";
  const fs::path variant = make_variant(absorbed, tmp / "kv_b.gguf");
  // attn_kv_b travels in the trunk: the pack path must give the same logits
  const fs::path prefix = tmp / "kv_b_pack";
  RunResult b = run(q(xpack_build_exe()) + " " + q(variant) + " -o " + q(prefix));
  REQUIRE_MESSAGE(b.rc == 0, b.out << b.err);

  for (const char* prompt : {"short", "long"}) {
    INFO(std::string(prompt));
    const json meta = read_json(reference_dir() / (std::string(prompt) + ".json"));
    REQUIRE(meta["n_vocab"].get<int>() == kVocab);
    const auto prompt_ids = meta["prompt_ids"].get<std::vector<int32_t>>();
    const auto gen_ids = meta["gen_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> all = prompt_ids;
    all.insert(all.end(), gen_ids.begin(), gen_ids.end());
    const std::vector<float> want = read_f32(reference_dir() / (std::string(prompt) + ".f32"));
    REQUIRE(want.size() == all.size() * kVocab);
    const size_t n_checked = first_fragile_position(
        read_json(*oracle / "logits" / ("kimi-k3-f32." + std::string(prompt) + ".route.json")), all.size());
    CHECK(n_checked > all.size() / 2);  // the margin escape must not hide most of the run

    // Teacher-forced on llama.cpp's ids: every row against its logits.
    const std::vector<float> got = run_logits(variant, all, 0, tmp / "kv_b.f32");
    REQUIRE(got.size() == want.size());
    const RowStats s = compare_rows(got, want, n_checked, kVocab, kTol);
    MESSAGE(std::string(prompt) << ": attn_kv_b vs llama.cpp max|diff| " << s.max_diff << ", " << s.rows_ok << "/"
                                << n_checked << " rows within 1e-3 (" << all.size() << " rows)");
    CHECK_MESSAGE(s.first_fail < 0, "first row over 1e-3: " << s.first_fail);

    RunResult p = run(q(xpack_run_exe()) + " -m " + q(prefix.string() + ".trunk.gguf") + " --pack " +
                      q(prefix.string() + ".xpack") + " --cache-mib 4 -t 2 --prompt-ids " + join_ids(all) +
                      " -n 0 --logits-out " + q(tmp / "kv_b_pack.f32"));
    REQUIRE_MESSAGE(p.rc == 0, p.out << p.err);
    CHECK(read_f32(tmp / "kv_b_pack.f32") == got);

    // Greedy decode from the prompt: llama.cpp's ids, and its rows again.
    const std::vector<float> decoded = run_logits(variant, prompt_ids, static_cast<int>(gen_ids.size()),
                                                  tmp / "kv_b_decode.f32");
    REQUIRE(decoded.size() == want.size());
    CHECK(greedy_ids(decoded, prompt_ids.size(), gen_ids.size()) == gen_ids);
    CHECK(compare_rows(decoded, want, n_checked, kVocab, kTol).first_fail < 0);

    // The absorbed model, the same math: the split reproduces attn_k_b/attn_v_b
    // element for element, so xpack-run computes the same floats.
    const std::vector<float> base = run_logits(absorbed, all, 0, tmp / "absorbed.f32");
    const RowStats a = compare_rows(got, base, all.size(), kVocab, kTol);
    MESSAGE(std::string(prompt) << ": attn_kv_b vs absorbed max|diff| " << a.max_diff);
    CHECK(got == base);

    // llama.cpp's attn_kv_b graph (the reference) against its absorbed graph
    // (the oracle's .seq.f32): the reference is the model's math, not a
    // second reading of xpack-run's.
    const std::vector<float> oracle_rows =
        read_f32(*oracle / "logits" / ("kimi-k3-f32." + std::string(prompt) + ".seq.f32"));
    const RowStats o = compare_rows(want, oracle_rows, n_checked, kVocab, kTol);
    MESSAGE(std::string(prompt) << ": llama.cpp attn_kv_b vs llama.cpp absorbed max|diff| " << o.max_diff);
    CHECK(o.first_fail < 0);
  }
}

TEST_CASE("kimi-k3 attn_kv_b: a wrong shape or llama.cpp's MHA-cache form is refused, naming what is wrong") {
  auto oracle = oracle_dir_with("kimi-k3-f32.gguf");
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3-f32.gguf) not found");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  const fs::path variant = make_variant(*oracle / "models" / "kimi-k3-f32.gguf", tmp / "kv_b.gguf");
  const fs::path mutate = source_root() / "test" / "runtime" / "kimi_k3_mutate.py";

  struct Bad {
    std::string make;    // shell command writing the damaged model to $BAD
    std::string expect;  // must appear in stderr
  } bads[] = {
      // one latent column short: ne {63, 256} where {64, 256} is expected
      {"python3 " + q(mutate) + " " + q(variant) + " BAD --cut-tensor blk.1.attn_kv_b.weight=63",
       "tensor blk.1.attn_kv_b.weight has shape [63, 256, 1, 1], expected [64, 256, 1, 1]"},
      {"python3 " + q(mutate) + " " + q(variant) + " BAD --cut-tensor blk.3.attn_kv_b.weight=32",
       "blk.3.attn_kv_b.weight"},
      // neither form: attn_k_b is looked for and named
      {"python3 " + q(mutate) + " " + q(variant) + " BAD --drop-tensor blk.3.attn_kv_b.weight",
       "missing tensor blk.3.attn_k_b.weight"},
      // llama.cpp's MHA-cache metadata (key_length_mla 0) is not read
      {"python3 " + q(source_root() / "test" / "runtime" / "kimi_k3_kv_b.py") + " " +
           q(*oracle / "models" / "kimi-k3-f32.gguf") + " BAD --form mha",
       "attention.key_length_mla must be positive (got 0)"},
  };
  int i = 0;
  for (const Bad& b : bads) {
    CAPTURE(b.make);
    const fs::path bad = tmp / ("bad" + std::to_string(i++) + ".gguf");
    std::string cmd = b.make;
    cmd.replace(cmd.find(" BAD"), 4, " " + q(bad));
    RunResult m = run(cmd);
    REQUIRE_MESSAGE(m.rc == 0, m.out << m.err);
    RunResult r = run(q(xpack_run_exe()) + " -m " + q(bad) + " --prompt-ids 1,403,407 -n 0");
    INFO("stderr: " << r.err);
    CHECK(r.rc != 0);
    CHECK(r.err.find(b.expect) != std::string::npos);
    CHECK(r.out.empty());  // errors go to stderr only
  }
}
