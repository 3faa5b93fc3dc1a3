#include "gpu_harness.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "runtime_harness.h"

namespace xpack::test::gpu {

using xrun_test::join_ids;
using xrun_test::q;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  }
  return m;
}

std::vector<int32_t> OracleRun::all() const {
  std::vector<int32_t> v = prompt;
  v.insert(v.end(), gen.begin(), gen.end());
  return v;
}

OracleRun load_run(const std::filesystem::path& oracle, const std::string& ref) {
  const nlohmann::json meta = xrun_test::read_json(oracle / "logits" / (ref + ".json"));
  return {meta["prompt_ids"].get<std::vector<int32_t>>(), meta["gen_ids"].get<std::vector<int32_t>>()};
}

nlohmann::json run_logits(const std::string& args, const std::filesystem::path& out, std::vector<float>* logits) {
  xrun_test::RunResult r = xrun_test::run(q(xrun_test::xpack_run_exe()) + " " + args + " --json --logits-out " + q(out));
  INFO(args << "\n" << r.err);
  REQUIRE(r.rc == 0);
  *logits = xrun_test::read_f32(out);
  return nlohmann::json::parse(r.out);
}

std::vector<float> batch_logits(const std::string& model_args, const std::vector<int32_t>& ids,
                                const std::filesystem::path& out, size_t n_vocab) {
  std::vector<float> v;
  run_logits(model_args + " --prompt-ids " + join_ids(ids) + " -n 0", out, &v);
  REQUIRE(v.size() == ids.size() * n_vocab);
  return v;
}

std::vector<int32_t> decode(const std::string& model_args, const std::vector<int32_t>& prompt, size_t n_gen,
                            const std::filesystem::path& out, std::vector<float>* logits, size_t n_vocab) {
  nlohmann::json j = run_logits(model_args + " --prompt-ids " + join_ids(prompt) + " -n " + std::to_string(n_gen) +
                                    " --ignore-eos",
                                out, logits);
  REQUIRE(logits->size() == (prompt.size() + n_gen) * n_vocab);
  return j["gen_ids"].get<std::vector<int32_t>>();
}

}  // namespace xpack::test::gpu
