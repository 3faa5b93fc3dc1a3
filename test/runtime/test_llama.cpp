// xpack-run end to end on stories260K (real trained weights): llama.cpp's greedy
// ids and text, decode-vs-batch consistency, and clear errors on bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

json golden() {
  fs::path p = xpack::test::data_dir() / "stories260K.once.json";
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), "missing " << p);
  return json::parse(f);
}

std::string xrun(const std::string& args) { return q(xpack_run_exe()) + " " + args; }

}  // namespace

TEST_CASE("stories260K: greedy ids after <s> Once equal llama.cpp's") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found in test/data or ../shared/models");
    return;
  }
  json g = golden();
  auto want = g["gen_ids"].get<std::vector<int32_t>>();
  REQUIRE(want.size() == 60);
  RunResult r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 60 --json"));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  json out = json::parse(r.out);
  CHECK(out["prompt_ids"].get<std::vector<int32_t>>() == std::vector<int32_t>{1, 403});
  CHECK(out["gen_ids"].get<std::vector<int32_t>>() == want);
  CHECK(out["prefill_tok_s"].get<double>() > 0);
  CHECK(out["decode_tok_s"].get<double>() > 0);
  CHECK(out.contains("counters"));
}

TEST_CASE("stories260K: same ids with 1 thread and with 3 threads") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  xpack::test::TempDir tmp;
  RunResult a = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 16 -t 1 --logits-out " + q(tmp / "a.f32")));
  RunResult b = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 16 -t 3 --logits-out " + q(tmp / "b.f32")));
  REQUIRE(a.rc == 0);
  REQUIRE(b.rc == 0);
  // Each output element is summed by one thread in a fixed order: bit-identical.
  CHECK(xpack::test::read_file(tmp / "a.f32") == xpack::test::read_file(tmp / "b.f32"));
}

TEST_CASE("stories260K: -p \"Once\" prints llama.cpp's story") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  RunResult r = run(xrun("-m " + q(*model) + " -p Once -n 60"));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const std::string want =
      " upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
      "saw a big, red ball. She wanted to play with it, but it was too high.";
  // The text as it is produced, then one newline (llama.cpp's example prints the same).
  CHECK(r.out == want + "\n");

  RunResult j = run(xrun("-m " + q(*model) + " -p Once -n 60 --json"));
  REQUIRE(j.rc == 0);
  json out = json::parse(j.out);
  // BOS comes from the tokenizer metadata: the prompt is <s> Once.
  CHECK(out["prompt_ids"].get<std::vector<int32_t>>() == std::vector<int32_t>{1, 403});
  CHECK(out["gen_ids"].get<std::vector<int32_t>>() == golden()["gen_ids"].get<std::vector<int32_t>>());
  CHECK(out["text"].get<std::string>().substr(0, want.size()) == want);
}

TEST_CASE("runtime harness: run() returns stdout and stderr apart") {
  RunResult r = run("echo to-out; echo to-err >&2; exit 3");
  CHECK(r.rc == 3);
  CHECK(r.out == "to-out\n");
  CHECK(r.err == "to-err\n");
}

// stdout and stderr into one pipe (as on one terminal, or `> log 2>&1`): the
// text must end its line before the speed line on stderr starts.
TEST_CASE("stories260K: the speed line starts on its own line after the text") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  RunResult r = run(xrun("-m " + q(*model) + " -p Once -n 20 2>&1"));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const size_t speed = r.out.find("xpack-run: prompt ");
  REQUIRE(speed != std::string::npos);
  REQUIRE(speed > 0);
  CHECK(r.out[speed - 1] == '\n');
  CHECK(r.out.substr(0, 12) == " upon a time");
  CHECK(r.out.find('\n', speed) == r.out.size() - 1);  // the speed line is the last line
}

TEST_CASE("stories260K: --logits-out rows; decode with KV cache equals one batch") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  xpack::test::TempDir tmp;
  RunResult r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403,407 -n 20 --json --logits-out " +
                         q(tmp / "gen.f32")));
  REQUIRE(r.rc == 0);
  auto gen = json::parse(r.out)["gen_ids"].get<std::vector<int32_t>>();
  REQUIRE(gen.size() == 20);
  std::vector<float> a = read_f32(tmp / "gen.f32");
  const size_t n_vocab = 512;
  // Every prompt row, then one row per generated token after it is fed back.
  REQUIRE(a.size() == (3 + 20) * n_vocab);

  std::vector<int32_t> all = {1, 403, 407};
  all.insert(all.end(), gen.begin(), gen.end());
  RunResult b = run(xrun("-m " + q(*model) + " --prompt-ids " + join_ids(all) + " -n 0 --logits-out " +
                         q(tmp / "batch.f32")));
  REQUIRE(b.rc == 0);
  std::vector<float> c = read_f32(tmp / "batch.f32");
  REQUIRE(c.size() == a.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - c[i]));
  CHECK(worst <= 1e-4f);
  // The greedy ids are the argmax of the previous row.
  for (size_t k = 0; k < gen.size(); ++k) {
    const float* row = &a[(2 + k) * n_vocab];
    size_t best = 0;
    for (size_t v = 1; v < n_vocab; ++v)
      if (row[v] > row[best]) best = v;
    CHECK(int32_t(best) == gen[k]);
  }
}

TEST_CASE("xpack-run: bad input gives a clear error and a non-zero exit") {
  auto model = stories260k();
  xpack::test::TempDir tmp;

  RunResult r = run(xrun("-m " + q(tmp / "nope.gguf") + " --prompt-ids 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("nope.gguf") != std::string::npos);

  r = run(xrun("--prompt-ids 1"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("-m MODEL is required") != std::string::npos);

  r = run(xrun("-m x.gguf --prompt-ids 1,x"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("--prompt-ids") != std::string::npos);

  r = run(xrun("-m x.gguf --prompt-ids 1, -n 3"));
  CHECK(r.rc == 2);

  r = run(xrun("-m x.gguf -p hi --prompt-ids 1"));
  CHECK(r.rc == 2);

  r = run(xrun("-m x.gguf --prompt-ids 1 -n -1"));
  CHECK(r.rc == 2);

  r = run(xrun("-m x.gguf --prompt-ids 1 --bogus"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("--bogus") != std::string::npos);

  r = run(xrun("--help"));
  CHECK(r.rc == 0);
  CHECK(r.out.find("--prompt-ids") != std::string::npos);

  // A file that is not a GGUF.
  xpack::test::write_file(tmp / "junk.gguf", std::vector<uint8_t>(100, 0x41));
  r = run(xrun("-m " + q(tmp / "junk.gguf") + " --prompt-ids 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("junk.gguf") != std::string::npos);

  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "(partly) stories260K.gguf not found");
    return;
  }
  // --device cuda without CUDA: test_device.cpp.

  r = run(xrun("-m " + q(*model) + " --prompt-ids 1,512 -n 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("512") != std::string::npos);

  // A truncated copy of the model.
  std::vector<uint8_t> bytes = xpack::test::read_file(*model);
  bytes.resize(bytes.size() / 2);
  xpack::test::write_file(tmp / "half.gguf", bytes);
  r = run(xrun("-m " + q(tmp / "half.gguf") + " --prompt-ids 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("half.gguf") != std::string::npos);

  // stories260K is dense: a pack that does not exist is an error, not ignored.
  r = run(xrun("-m " + q(*model) + " --pack " + q(tmp / "none.xpack") + " --prompt-ids 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("none.xpack") != std::string::npos);
}

TEST_CASE("stories260K: --temp sampling is reproducible for a seed; --stats writes the JSON") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  xpack::test::TempDir tmp;
  auto ids = [&](const std::string& extra) {
    RunResult r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 40 --json " + extra));
    INFO(r.err);
    REQUIRE(r.rc == 0);
    return json::parse(r.out)["gen_ids"].get<std::vector<int32_t>>();
  };
  auto a = ids("--temp 1.5 --seed 7");
  auto b = ids("--temp 1.5 --seed 7");
  auto c = ids("--temp 1.5 --seed 8");
  CHECK(a == b);
  CHECK(a != c);  // 40 draws at a high temperature: equal sequences would mean the seed is ignored
  CHECK(a != golden()["gen_ids"].get<std::vector<int32_t>>()); 
  for (int32_t id : a) CHECK((id >= 0 && id < 512));

  RunResult r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 5 --stats " + q(tmp / "stats.json")));
  REQUIRE(r.rc == 0);
  std::ifstream f(tmp / "stats.json");
  json st = json::parse(f);
  CHECK(st["gen_ids"].size() == 5);
  CHECK(st.contains("decode_tok_s"));
  CHECK(st.contains("counters"));
}

// Without --logits-out a prompt's eval computes only its last logits row; the
// token sampled from it must not depend on that (a wrong row, or a row taken
// through another kernel, would change a high-temperature draw).
TEST_CASE("xpack-run: the sampled tokens are the same with and without --logits-out's every-row prefill") {
  std::vector<fs::path> models;
  if (auto m = stories260k()) models.push_back(*m);
  for (const char* f : {"deepseek4-f32.gguf", "kimi-k3-f32.gguf"})
    if (auto d = oracle_dir_with(f)) models.push_back(*d / "models" / f);
  if (models.empty()) {
    xpack::test::skip(xpack::test::Absent::kFixture, "neither stories260K.gguf nor the oracle models found");
    return;
  }
  xpack::test::TempDir tmp;
  for (const fs::path& m : models) {
    CAPTURE(m.filename().string());
    const std::string base = "-m " + q(m) + " --prompt-ids 1,17,33,49,65,81,97,113,129,145,161,177 -n 24 --json " +
                             "--temp 1.5 --seed 11 ";
    auto ids = [&](const std::string& extra) {
      RunResult r = run(xrun(base + extra));
      INFO(r.err);
      REQUIRE(r.rc == 0);
      return json::parse(r.out)["gen_ids"].get<std::vector<int32_t>>();
    };
    const std::vector<int32_t> last_only = ids("");
    CHECK(ids("--logits-out " + q(tmp / "rows.f32")) == last_only);
    CHECK(last_only.size() == 24);
    // Every prompt row, then one per generated token (each is fed back).
    const size_t floats = read_f32(tmp / "rows.f32").size();
    CHECK((floats > 0 && floats % (12 + 24) == 0));
  }
}

TEST_CASE("stories260K: a prompt longer than the context is refused; generation stops at the context") {
  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");
    return;
  }
  auto ids = [](int n) {
    std::string s = "1";
    for (int i = 1; i < n; ++i) s += ",403";
    return s;
  };
  // llama.context_length is 2048 in stories260K.
  RunResult over = run(xrun("-m " + q(*model) + " --prompt-ids " + ids(2049) + " -n 1"));
  CHECK(over.rc == 1);
  CHECK_MESSAGE(over.err.find("2049 tokens, more than the model's context of 2048") != std::string::npos, over.err);
  RunResult near = run(xrun("-m " + q(*model) + " --prompt-ids " + ids(2045) + " -n 10 --ignore-eos --json"));
  REQUIRE_MESSAGE(near.rc == 0, near.err);
  CHECK(near.err.find("generating 3 tokens, not 10") != std::string::npos);
  CHECK(nlohmann::json::parse(near.out)["gen_ids"].size() == 3);
}
