// Test cases that cannot run here record why, so the suite reports SKIP (exit 77)
// instead of passing as if it had checked something.
#pragma once
#include <string>

namespace xpack::test {

enum class Absent {
  // A fixture CI always has (../shared, the gguf Python package): under CI
  // (XPACK_REQUIRE_FIXTURES=1, set by .ci/run) its absence is a failure.
  kFixture,
  // What no CI machine has (a GPU, the right to mount): always a skip.
  kCapability,
};

// Records that the current test case (or part of it) did not run and why; the
// caller returns. doctest_main.cpp turns a run with skips and no failures into 77.
void skip(Absent what, const std::string& why);
int skipped_count();
// Prints each recorded reason to stderr (doctest_main.cpp, at the end).
void print_skips();

// True when python3 can import numpy and gguf (llama.cpp's gguf-py); otherwise
// *why says what the import printed. Checked once per process.
bool have_python_gguf(std::string* why = nullptr);

}  // namespace xpack::test

// Ends the current test case as skipped unless python3 has numpy and gguf.
#define XPACK_REQUIRE_PYTHON_GGUF()                                       \
  do {                                                                    \
    std::string why_python_;                                              \
    if (!::xpack::test::have_python_gguf(&why_python_)) {                 \
      ::xpack::test::skip(::xpack::test::Absent::kFixture, why_python_);  \
      return;                                                             \
    }                                                                     \
  } while (0)
