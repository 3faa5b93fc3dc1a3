// run_server in a build configured without cpp-httplib: --server says what is missing.
#include <cstdio>

#include "server.h"

namespace xrun {

int run_server(const ServerRun&) {
  std::fprintf(stderr,
               "xpack-run: --server: this build has no server: cpp-httplib (Debian's libcpp-httplib-dev) was not "
               "found when it was configured; install it (tools/install-deps.sh) and run meson setup again\n");
  return 1;
}

}  // namespace xrun
