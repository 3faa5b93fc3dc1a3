// The timing lines llama.cpp prints at the end of a run (load, prompt eval and
// eval: ms, ms per token, tokens per second), for people who compare the two by eye.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace xrun {

inline std::string speed_lines(double load_s, double prefill_s, size_t n_prompt, double decode_s, size_t n_decoded) {
  auto line = [](const char* what, double s, size_t n, const char* unit) {
    char buf[256];
    const double ms = s * 1e3;
    if (n == 0) {
      std::snprintf(buf, sizeof buf, "xpack-run: %13s time = %10.2f ms / %5zu %s\n", what, ms, n, unit);
    } else {
      std::snprintf(buf, sizeof buf, "xpack-run: %13s time = %10.2f ms / %5zu %s (%8.2f ms per token, %8.2f tokens per second)\n",
                    what, ms, n, unit, ms / double(n), s > 0 ? double(n) / s : 0.0);
    }
    return std::string(buf);
  };
  char load[128];
  std::snprintf(load, sizeof load, "xpack-run: %13s time = %10.2f ms\n", "load", load_s * 1e3);
  return load + line("prompt eval", prefill_s, n_prompt, "tokens") + line("eval", decode_s, n_decoded, "runs");
}

}  // namespace xrun
