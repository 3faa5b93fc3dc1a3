#include "xpack-build-progress.h"

#include <cstdio>

#include "common/checked_math.h"

void ProgressBar::update(const char* phase, uint64_t done, uint64_t total) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (phase_ != phase) {
    // Rate and ETA are per phase: "verify" reads at another speed than "experts".
    phase_ = phase;
    phase_start_ = now;
    last_draw_ = {};
  }
  if (done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double secs = std::chrono::duration<double>(now - phase_start_).count();
  double frac = total ? double(done) / double(total) : 1.0;
  double rate = secs > 0 ? double(done) / secs : 0;
  double eta = rate > 0 ? double(total - done) / rate : 0;
  constexpr int kWidth = 30;
  int fill = static_cast<int>(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
  bar[kWidth] = 0;
  char a[32], b[32], r[32];
  std::fprintf(stderr, "\r%-7s [%s] %5.1f%% %s / %s  %s/s  ETA %d:%02d   ", phase, bar, frac * 100,
               xpack::human_bytes(done, a, sizeof a), xpack::human_bytes(total, b, sizeof b),
               xpack::human_bytes(static_cast<uint64_t>(rate), r, sizeof r), int(eta) / 60, int(eta) % 60);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}
