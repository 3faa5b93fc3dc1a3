// Kimi-K3 (examples/xpack-run/models/kimi_k3) against llama.cpp's own logits in
// ../shared/oracle: teacher-forced prefill rows, greedy decode through the KDA /
// MLA state, every model file (F32, Q2_K/Q3_K experts, the 3-shard set), and
// damaged models that must fail with a message naming what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

constexpr int kVocab = 512;  // the oracle models' vocabulary (MANIFEST.md)

std::optional<fs::path> oracle_dir() { return oracle_dir_with("kimi-k3-f32.gguf"); }

// xpack-run teacher-forced on ids, -n 0: one logits row per id.
std::vector<float> run_logits(const std::string& model_args, const std::vector<int32_t>& ids, const fs::path& out,
                              int n_gen = 0) {
  RunResult r = run(q(xpack_run_exe()) + " " + model_args + " --prompt-ids " + join_ids(ids) + " -n " +
                    std::to_string(n_gen) + " --ignore-eos --logits-out " + q(out));
  REQUIRE_MESSAGE(r.rc == 0, model_args << "\n" << r.out << r.err);
  return read_f32(out);
}

// Checks every row of one (model, prompt) against the oracle's sequential logits.
void check_oracle(const fs::path& oracle, const std::string& model_args, const std::string& ref,
                  const fs::path& tmp) {
  const json meta = read_json(oracle / "logits" / (ref + ".json"));
  std::vector<int32_t> ids = meta["prompt_ids"].get<std::vector<int32_t>>();
  for (int32_t g : meta["gen_ids"]) ids.push_back(g);
  const std::vector<float> want = read_f32(oracle / "logits" / (ref + ".seq.f32"));
  REQUIRE(want.size() == ids.size() * kVocab);

  const std::vector<float> got = run_logits(model_args, ids, tmp / "logits.f32");
  REQUIRE(got.size() == want.size());
  const size_t n_checked = first_fragile_position(read_json(oracle / "logits" / (ref + ".route.json")), ids.size());
  const RowStats s = compare_rows(got, want, n_checked, kVocab, 1e-3);
  MESSAGE(ref << " [" << model_args << "]: max|diff| " << s.max_diff << ", "
              << s.rows_ok << "/" << n_checked << " rows within 1e-3 (" << ids.size() << " rows)");
  CHECK_MESSAGE(s.first_fail < 0, ref << ": first row over 1e-3: " << s.first_fail);
  CHECK(n_checked > ids.size() / 2);  // the margin escape must not hide most of the run
}

}  // namespace

TEST_CASE("kimi-k3: teacher-forced logits match llama.cpp on every oracle model") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3 models) not found");
    return;
  }
  xpack::test::TempDir tmp;
  const fs::path models = *oracle / "models";
  struct Case {
    const char* file;
    const char* ref;
  } cases[] = {
      {"kimi-k3-f32.gguf", "kimi-k3-f32"},
      // quantized weights computed exactly: compared with the dequantized model's logits
      {"kimi-k3-q2k-q3k.gguf", "kimi-k3-q2k-q3k-deq"},
      {"kimi-k3-q2k-q3k-00001-of-00003.gguf", "kimi-k3-q2k-q3k-deq"},
  };
  for (const Case& c : cases) {
    if (!xpack::test::fixture_file(models, c.file)) continue;
    for (const char* prompt : {"short", "long"}) {
      INFO(std::string(c.file) << " " << std::string(prompt));
      check_oracle(*oracle, "-m " + q(models / c.file) + " -t 2", std::string(c.ref) + "." + prompt, tmp.path());
    }
  }
}

TEST_CASE("kimi-k3: the pack path streams experts through a 4 MiB cache, bit-identical to the GGUF") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3 models) not found");
    return;
  }
  xpack::test::TempDir tmp;
  struct Case {
    const char* file;
    const char* ref;
  } cases[] = {
      {"kimi-k3-f32.gguf", "kimi-k3-f32"},
      {"kimi-k3-q2k-q3k-00001-of-00003.gguf", "kimi-k3-q2k-q3k-deq"},
  };
  int i = 0;
  for (const Case& c : cases) {
    INFO(std::string(c.file));
    const fs::path src = *oracle / "models" / c.file;
    const fs::path prefix = tmp / ("k" + std::to_string(i++));
    RunResult b = run(q(xpack_build_exe()) + " " + q(src) + " -o " + q(prefix));
    REQUIRE_MESSAGE(b.rc == 0, b.out << b.err);
    const std::string pack_args = "-m " + q(prefix.string() + ".trunk.gguf") + " --pack " +
                                  q(prefix.string() + ".xpack") + " --cache-mib 4 -t 2";
    for (const char* prompt : {"short", "long"}) {
      INFO(std::string(prompt));
      const std::string ref = std::string(c.ref) + "." + prompt;
      check_oracle(*oracle, pack_args, ref, tmp.path());
      // streamed experts and the GGUF's own expert tensors: the same bytes, the same logits
      const json meta = read_json(*oracle / "logits" / (ref + ".json"));
      std::vector<int32_t> ids = meta["prompt_ids"].get<std::vector<int32_t>>();
      for (int32_t g : meta["gen_ids"]) ids.push_back(g);
      const std::vector<float> streamed = run_logits(pack_args, ids, tmp / "streamed.f32");
      const std::vector<float> plain = run_logits("-m " + q(src) + " -t 2", ids, tmp / "plain.f32");
      CHECK(streamed == plain);
    }
  }
}

TEST_CASE("kimi-k3: greedy decode through the KDA/MLA state equals the batch and llama.cpp") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3 models) not found");
    return;
  }
  xpack::test::TempDir tmp;
  for (const char* ref : {"kimi-k3-f32.short", "kimi-k3-f32.long"}) {
    INFO(std::string(ref));
    const json meta = read_json(*oracle / "logits" / (std::string(ref) + ".json"));
    const auto prompt = meta["prompt_ids"].get<std::vector<int32_t>>();
    const auto gen = meta["gen_ids"].get<std::vector<int32_t>>();
    const std::string model = "-m " + q(*oracle / "models" / "kimi-k3-f32.gguf") + " -t 2";

    // greedy decode from the prompt: the logits file holds every prompt row, then
    // one row per generated token after it was fed back
    const std::vector<float> decoded = run_logits(model, prompt, tmp / "dec.f32", static_cast<int>(gen.size()));
    REQUIRE(decoded.size() == (prompt.size() + gen.size()) * kVocab);
    // the ids it chose: greedy = argmax of the previous row, ties to the lowest id
    std::vector<int32_t> chosen;
    for (size_t k = 0; k < gen.size(); ++k) {
      const float* row = &decoded[(prompt.size() - 1 + k) * kVocab];
      chosen.push_back(static_cast<int32_t>(std::max_element(row, row + kVocab) - row));
    }
    CHECK(chosen == gen);

    // The same tokens as one batch: every decode row (one token at a time on the
    // state left by the prefill) within 1e-4 of the batch row.
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    const std::vector<float> batch = run_logits(model, all, tmp / "batch.f32");
    const RowStats s = compare_rows(decoded, batch, all.size(), kVocab, 1e-4);
    MESSAGE(std::string(ref) << ": decode vs batch max|diff| " << s.max_diff);
    CHECK_MESSAGE(s.first_fail < 0, "first decode row over 1e-4: " << s.first_fail);

    const std::vector<float> want = read_f32(*oracle / "logits" / (std::string(ref) + ".seq.f32"));
    CHECK(compare_rows(decoded, want, all.size(), kVocab, 1e-3).first_fail < 0);
  }
}

// Hyperparameters other than the oracle's (no KDA lower bound: kimi-linear's
// softplus gate; residual attention off or banking every layer): no reference
// logits exist, but the model must run, react to the change and decode exactly
// as it prefills.
TEST_CASE("kimi-k3: other hyperparameters run, change the logits and decode like the batch") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3 models) not found");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  const fs::path src = *oracle / "models" / "kimi-k3-f32.gguf";
  const fs::path mutate = source_root() / "test" / "runtime" / "kimi_k3_mutate.py";
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 400, 428, 395};
  const int n_gen = 6;
  const std::vector<float> base = run_logits("-m " + q(src) + " -t 2", prompt, tmp / "base.f32");

  int i = 0;
  for (const char* change : {"--drop-key kimi-k3.kda.gate_lower_bound", "--set-int kimi-k3.attn_res.block_size=0",
                             "--set-int kimi-k3.attn_res.block_size=1", "--set-int kimi-k3.attn_res.block_size=3",
                             "--set-int kimi-k3.expert_used_count=3"}) {
    INFO(std::string(change));
    const fs::path model = tmp / ("v" + std::to_string(i++) + ".gguf");
    RunResult m = run("python3 " + q(mutate) + " " + q(src) + " " + q(model) + " " + change);
    REQUIRE_MESSAGE(m.rc == 0, "kimi_k3_mutate.py failed (needs python3 with numpy and gguf): " << m.out << m.err);
    const std::string args = "-m " + q(model) + " -t 2";

    const std::vector<float> decoded = run_logits(args, prompt, tmp / "dec.f32", n_gen);
    REQUIRE(decoded.size() == (prompt.size() + n_gen) * kVocab);
    CHECK(std::all_of(decoded.begin(), decoded.end(), [](float v) { return std::isfinite(v); }));
    std::vector<int32_t> all = prompt;
    for (int k = 0; k < n_gen; ++k) {
      const float* row = &decoded[(prompt.size() - 1 + k) * kVocab];
      all.push_back(static_cast<int32_t>(std::max_element(row, row + kVocab) - row));
    }
    const std::vector<float> batch = run_logits(args, all, tmp / "batch.f32");
    CHECK(compare_rows(decoded, batch, all.size(), kVocab, 1e-4).first_fail < 0);
    // the change is visible: some prompt row moves by more than float noise
    CHECK(compare_rows(std::vector<float>(batch.begin(), batch.begin() + base.size()), base, prompt.size(), kVocab, 1e-3)
              .rows_ok < prompt.size());
  }
}

TEST_CASE("kimi-k3: damaged models fail with a message naming the problem") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3 models) not found");
    return;
  }
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  const fs::path mutate = source_root() / "test" / "runtime" / "kimi_k3_mutate.py";
  struct Damage {
    const char* src;
    const char* change;
    const char* expect;  // must appear in stderr
  } damages[] = {
      {"kimi-k3-f32.gguf", "--drop-tensor blk.2.ssm_f_b.weight", "blk.2.ssm_f_b.weight"},
      {"kimi-k3-f32.gguf", "--drop-tensor blk.3.attn_k_b.weight", "blk.3.attn_k_b.weight"},
      {"kimi-k3-f32.gguf", "--drop-tensor output_res_score.weight", "output_res_score.weight"},
      {"kimi-k3-f32.gguf", "--drop-tensor blk.1.ffn_routed_down.weight", "blk.1.ffn_routed_down.weight"},
      {"kimi-k3-f32.gguf", "--drop-key kimi-k3.attn_res.block_size", "kimi-k3.attn_res.block_size"},
      {"kimi-k3-f32.gguf", "--drop-key kimi-k3.kda.head_dim", "kimi-k3.kda.head_dim"},
      {"kimi-k3-f32.gguf", "--drop-key kimi-k3.activation.situ_beta", "kimi-k3.activation.situ_beta"},
      {"kimi-k3-f32.gguf", "--set-int kimi-k3.expert_gating_func=9", "expert_gating_func"},
      {"kimi-k3-f32.gguf", "--set-int kimi-k3.expert_used_count=9", "expert_used_count"},
      {"kimi-k3-f32.gguf", "--set-int kimi-k3.rope.dimension_count=48", "rope.dimension_count"},
      // a head dim that does not match the tensors is a shape error on the first KDA tensor
      {"kimi-k3-f32.gguf", "--set-int kimi-k3.kda.head_dim=16", "blk.0.ssm_conv1d_q.weight"},
      {"kimi-k3-f32.gguf", "--cut-tensor blk.1.exp_probs_b.bias=7", "blk.1.exp_probs_b.bias"},
      {"kimi-k3-f32.gguf", "--cut-tensor blk.0.ssm_a=3", "blk.0.ssm_a"},
      {"kimi-k3-f32.gguf", "--set-int kimi-k3.leading_dense_block_count=0", "blk.0.ffn_gate_exps.weight"},
      {"kimi-k3-q2k-q3k.gguf", "--drop-tensor blk.3.attn_gate.weight", ""},  // optional: must still run
  };
  int i = 0;
  for (const Damage& d : damages) {
    const std::string change = d.change;
    CAPTURE(change);
    if (!xpack::test::fixture_file(*oracle / "models", d.src)) continue;
    const fs::path bad = tmp / ("bad" + std::to_string(i++) + ".gguf");
    RunResult m = run("python3 " + q(mutate) + " " + q(*oracle / "models" / d.src) + " " + q(bad) + " " + d.change);
    REQUIRE_MESSAGE(m.rc == 0, "kimi_k3_mutate.py failed (needs python3 with numpy and gguf): " << m.out << m.err);
    RunResult r = run(q(xpack_run_exe()) + " -m " + q(bad) + " --prompt-ids 1,403,407 -n 0");
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    if (*d.expect == '\0') {
      CHECK(r.rc == 0);
    } else {
      CHECK(r.rc != 0);
      CHECK(r.err.find(d.expect) != std::string::npos);
      CHECK(r.out.empty());  // errors go to stderr only
    }
  }

  // token ids outside the vocabulary are refused, not read out of bounds
  RunResult r = run(q(xpack_run_exe()) + " -m " + q(*oracle / "models" / "kimi-k3-f32.gguf") +
                    " --prompt-ids 1,512 -n 0");
  CHECK(r.rc != 0);
  CHECK(r.err.find("512") != std::string::npos);
  CHECK(r.out.empty());
}

// Byte tokens (<0xA8> ...) make the generated bytes invalid UTF-8; the JSON must
// still parse everywhere: "text" carries U+FFFD for them, "text_hex" the bytes.
TEST_CASE("kimi-k3: --json and --stats are valid JSON when the text is raw byte tokens") {
  auto oracle = oracle_dir();
  if (!oracle) {
    xpack::test::skip(xpack::test::Absent::kFixture, "../shared/oracle (kimi-k3 models) not found");
    return;
  }
  xpack::test::TempDir tmp;
  const std::string args =
      "-m " + q(*oracle / "models" / "kimi-k3-f32.gguf") + " -t 2 --prompt-ids 1,403,407 -n 30 --ignore-eos";
  RunResult j = run(q(xpack_run_exe()) + " " + args + " --json --stats " + q(tmp / "json_stats.json"));
  REQUIRE_MESSAGE(j.rc == 0, j.err);
  RunResult t = run(q(xpack_run_exe()) + " " + args + " --stats " + q(tmp / "text_stats.json"));
  REQUIRE_MESSAGE(t.rc == 0, t.err);
  xpack::test::write_file(tmp / "stdout.json", std::vector<uint8_t>(j.out.begin(), j.out.end()));

  json parsed;
  REQUIRE_NOTHROW(parsed = json::parse(j.out));
  json from_stats;
  REQUIRE_NOTHROW(from_stats = read_json(tmp / "text_stats.json"));
  CHECK(parsed["gen_ids"].size() == 30);
  CHECK(from_stats["gen_ids"] == parsed["gen_ids"]);
  CHECK(from_stats["text"] == parsed["text"]);
  CHECK(parsed["text"].get<std::string>().find("\xEF\xBF\xBD") != std::string::npos);

  // Python's strict json module; the run must really contain invalid UTF-8,
  // and "text" must be exactly those bytes decoded with U+FFFD replacement
  // (well-formed characters kept as they are).
  const std::string check = R"PY(
import json, sys
for path in sys.argv[1:]:
    with open(path, 'rb') as f:
        obj = json.loads(f.read().decode('utf-8'))
    raw = bytes.fromhex(obj['text_hex'])
    try:
        raw.decode('utf-8')
        sys.exit(path + ': the generated bytes are valid UTF-8, the test needs byte tokens')
    except UnicodeDecodeError:
        pass
    if obj['text'] != raw.decode('utf-8', 'replace'):
        sys.exit(path + ': text is not text_hex decoded with U+FFFD replacement')
print('ok')
)PY";
  xpack::test::write_file(tmp / "check.py", std::vector<uint8_t>(check.begin(), check.end()));
  RunResult py = run("python3 " + q(tmp / "check.py") + " " + q(tmp / "stdout.json") + " " +
                     q(tmp / "json_stats.json") + " " + q(tmp / "text_stats.json"));
  INFO(py.out << py.err);
  CHECK(py.rc == 0);
  CHECK(py.out == "ok\n");
}
