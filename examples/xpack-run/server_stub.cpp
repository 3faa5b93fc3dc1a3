// run_server in a build configured without cpp-httplib: --server says what is missing.
#include <cstdio>
#include <string>

#include "server.h"

namespace xrun {

std::string server_unavailable() {
  return "--server: this build has no server: cpp-httplib (Debian's libcpp-httplib-dev) was not found when it was "
         "configured; install it (tools/install-deps.sh) and run meson setup again";
}

int run_server(const ServerRun&) {
  std::fprintf(stderr, "xpack-run: %s\n", server_unavailable().c_str());
  return 1;
}

}  // namespace xrun
