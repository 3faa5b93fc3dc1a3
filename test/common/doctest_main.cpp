// doctest's main, plus the skip rule (skip.h): a run where some case could not
// run and nothing failed exits 77, Meson's SKIP, naming what was missing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "skip.h"

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  if (rc == 0 && xpack::test::skipped_count() > 0) {
    xpack::test::print_skips();
    return 77;
  }
  return rc;
}
