// xpack-run --device cuda where it cannot run: a build without CUDA, or a CUDA
// build on a machine without a GPU, fails with exit 1 and a message naming what
// is missing, before the model is read. Where a GPU is usable the refusal cannot
// be seen: the run must then succeed on the CUDA backend (test/cuda checks its
// results), and the refusal part is reported as skipped.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;

namespace {

std::string xrun(const std::string& args) { return q(xpack_run_exe()) + " " + args; }

bool names_what_is_missing(const std::string& err) {
  return err.find("--device cuda") != std::string::npos &&
         (err.find("built without CUDA") != std::string::npos || err.find("no CUDA device") != std::string::npos) &&
         err.find("--device cpu") != std::string::npos;
}

}  // namespace

TEST_CASE("--device cuda without CUDA or without a GPU: exit 1 naming what is missing") {
  // A model path that does not exist: the device is checked first, so the
  // message is about CUDA, not the file.
  RunResult r = run(xrun("-m /nonexistent/model.gguf --prompt-ids 1 -n 1 --device cuda"));
  INFO(r.err);
  if (r.rc == 1 && r.err.find("nonexistent") != std::string::npos && !names_what_is_missing(r.err)) {
    // A usable GPU: the backend came up and the missing file is the error.
    xpack::test::skip(xpack::test::Absent::kCapability, "a CUDA device is usable here: the refusal cannot be seen");
    auto model = stories260k();
    if (!model) return;
    RunResult ok = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 2 --json --device cuda"));
    INFO(ok.err);
    REQUIRE(ok.rc == 0);
    CHECK(nlohmann::json::parse(ok.out)["backend"] == "cuda");
    return;
  }
  CHECK(r.rc == 1);
  CHECK(names_what_is_missing(r.err));
  CHECK(r.err.find("nonexistent") == std::string::npos);
  CHECK(r.out.empty());

  auto model = stories260k();
  if (!model) {
    xpack::test::skip(xpack::test::Absent::kFixture, "(partly) stories260K.gguf not found");
    return;
  }
  RunResult m = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 4 --json --device cuda"));
  INFO(m.err);
  CHECK(m.rc == 1);
  CHECK(names_what_is_missing(m.err));
  CHECK(m.out.empty());
  // The CPU is unaffected.
  RunResult c = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 4 --json --device cpu"));
  REQUIRE(c.rc == 0);
  CHECK(nlohmann::json::parse(c.out)["backend"] == "cpu");
}

TEST_CASE("--device: anything but cpu or cuda is a usage error") {
  RunResult r = run(xrun("-m /nonexistent/model.gguf --prompt-ids 1 --device rocm"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("--device") != std::string::npos);
}
