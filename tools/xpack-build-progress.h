// Terminal progress bar for xpack-build: bytes/s and ETA, redrawn at most 10 times a
// second on stderr; silent when disabled (--json or stderr not a terminal).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void update(const char* phase, uint64_t done, uint64_t total);
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::string phase_;
  std::chrono::steady_clock::time_point phase_start_{};
  std::chrono::steady_clock::time_point last_draw_{};
};
