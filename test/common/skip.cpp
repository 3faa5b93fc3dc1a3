#include "skip.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <doctest/doctest.h>

#include "fixtures.h"

namespace xpack::test {

namespace {
std::mutex g_mu;
std::vector<std::string> g_reasons;

bool fixtures_required() {
  const char* v = std::getenv("XPACK_REQUIRE_FIXTURES");
  return v && std::string(v) == "1";
}
}  // namespace

void skip(Absent what, const std::string& why) {
  if (what == Absent::kFixture && fixtures_required()) {
    FAIL_CHECK("required fixture absent (XPACK_REQUIRE_FIXTURES=1): " << why);
    return;
  }
  MESSAGE("SKIPPED: " << why);
  std::lock_guard lk(g_mu);
  g_reasons.push_back(why);
}

int skipped_count() {
  std::lock_guard lk(g_mu);
  return static_cast<int>(g_reasons.size());
}

void print_skips() {
  std::lock_guard lk(g_mu);
  for (const auto& r : g_reasons) std::fprintf(stderr, "SKIP: %s\n", r.c_str());
}

bool have_python_gguf(std::string* why) {
  static std::once_flag once;
  static bool ok = false;
  static std::string out;
  std::call_once(once, [] { ok = run_command("python3 -c 'import numpy, gguf'", &out) == 0; });
  if (!ok && why) *why = "python3 with numpy and gguf (pip install gguf) is needed: " + out;
  return ok;
}

}  // namespace xpack::test
