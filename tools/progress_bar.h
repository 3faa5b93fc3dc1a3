// Terminal progress bar for xpack-build and xpack-inspect --verify: bytes/s and ETA,
// redrawn at most 10 times a second on stderr; silent when disabled (--json, or stderr
// not a terminal without --progress).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

class ProgressBar {
 public:
  using Clock = std::chrono::steady_clock;
  // `now` and `out` are for tests: an injected clock, and where the bar is drawn.
  explicit ProgressBar(bool enabled, std::function<Clock::time_point()> now = Clock::now, std::FILE* out = stderr)
      : enabled_(enabled), now_(std::move(now)), out_(out) {}
  // `done` of `total` bytes of `phase`. `done` may count bytes of earlier phases too
  // (xpack-build's trunk bytes stay in the experts' count): the rate counts only what
  // this phase did.
  void update(const char* phase, uint64_t done, uint64_t total);
  void finish();
  // The last line drawn (without the leading '\r'), for tests.
  const std::string& line() const { return line_; }

  // "1:05", "1:02:03"; "--:--" when unknown (no rate yet).
  static std::string eta_text(double seconds);

 private:
  bool enabled_;
  std::function<Clock::time_point()> now_;
  std::FILE* out_;
  bool drawn_ = false;
  std::string phase_;
  std::string line_;
  uint64_t phase_done0_ = 0;  // `done` when the phase began
  Clock::time_point phase_start_{};
  Clock::time_point last_draw_{};
};
