#include "progress_bar.h"

#include <algorithm>
#include <cmath>

#include "common/checked_math.h"

std::string ProgressBar::eta_text(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "--:--";
  const uint64_t s = static_cast<uint64_t>(std::llround(seconds));
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60), static_cast<unsigned long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llu:%02llu", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  return buf;
}

void ProgressBar::update(const char* phase, uint64_t done, uint64_t total) {
  if (!enabled_) return;
  const Clock::time_point now = now_();
  if (phase_ != phase) {
    // Rate and ETA are per phase: "verify" reads at another speed than "experts".
    // The phase's own bytes are done minus what was done when it began: the builder's
    // count carries the trunk's bytes into the experts phase, and dividing those by
    // the experts' seconds made the rate huge and the ETA 0:00.
    phase_ = phase;
    phase_start_ = now;
    phase_done0_ = done;
    last_draw_ = {};
  }
  if (done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double secs = std::chrono::duration<double>(now - phase_start_).count();
  const uint64_t phase_bytes = done >= phase_done0_ ? done - phase_done0_ : 0;
  const double frac = total ? std::min(1.0, double(done) / double(total)) : 1.0;
  // No rate (so no ETA) until the phase has moved bytes over measurable time.
  const double rate = secs > 0 && phase_bytes > 0 ? double(phase_bytes) / secs : 0;
  const double left = done < total ? double(total - done) : 0;
  const double eta = done >= total ? 0 : rate > 0 ? left / rate : -1;
  constexpr int kWidth = 30;
  const int fill = static_cast<int>(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
  bar[kWidth] = 0;
  char a[32], b[32], r[32];
  const std::string rate_text =
      rate > 0 ? std::string(xpack::human_bytes(static_cast<uint64_t>(rate), r, sizeof r)) + "/s" : "-";
  char line[256];
  std::snprintf(line, sizeof line, "%-7s [%s] %5.1f%% %s / %s  %s  ETA %s", phase, bar, frac * 100,
                xpack::human_bytes(done, a, sizeof a), xpack::human_bytes(total, b, sizeof b), rate_text.c_str(),
                eta_text(eta).c_str());
  line_ = line;
  std::fprintf(out_, "\r%s   ", line);
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
}
