#include "common/checked_math.h"

#include <cstdio>

namespace xpack {

const char* human_bytes(uint64_t n, char* buf, unsigned buf_size) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0)
    std::snprintf(buf, buf_size, "%llu B", static_cast<unsigned long long>(n));
  else
    std::snprintf(buf, buf_size, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace xpack
