// libxpack.so exports exactly the functions xpack.h declares: nothing of the C++
// inside leaks (lib/capi/libxpack.map), and no declared function is missing.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "fixtures.h"
#include "skip.h"

namespace fs = std::filesystem;

namespace {

std::set<std::string> declared_functions() {
  std::ifstream f(fs::path(std::getenv("XPACK_SOURCE_ROOT") ? std::getenv("XPACK_SOURCE_ROOT") : ".") / "include" /
                  "xpack" / "xpack.h");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // "XPACK_API <return type> xpack_name(" (the return type may span '*' and spaces).
  std::regex decl(R"(XPACK_API[^;(]*?\b(xpack_\w+)\s*\()");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

}  // namespace

TEST_CASE("libxpack.so exports exactly the declared C API") {
  const std::set<std::string> want = declared_functions();
  REQUIRE(want.size() > 50);
  const fs::path so = xpack::test::build_dir() / "libxpack.so";
  REQUIRE(fs::exists(so));
  if (xpack::test::run_command("command -v nm >/dev/null") != 0) {
    xpack::test::skip(xpack::test::Absent::kFixture, "nm (binutils) is not installed");
    return;
  }
  std::string out;
  REQUIRE(xpack::test::run_command("nm -D --defined-only '" + so.string() + "'", &out) == 0);
  std::set<std::string> got;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    std::string name = line.substr(sp + 1);
    if (const size_t at = name.find('@'); at != std::string::npos) name.resize(at);  // symbol versions
    got.insert(name);
  }
  for (const auto& n : got) CHECK_MESSAGE(want.count(n) == 1, "exported but not in xpack.h: " << n);
  for (const auto& n : want) CHECK_MESSAGE(got.count(n) == 1, "declared in xpack.h but not exported: " << n);
}
