// The progress bar of xpack-build and xpack-inspect --verify (tools/progress_bar) with an injected clock: the
// rate counts only the phase's own bytes, the ETA follows from it, and an unknown ETA
// says so instead of 0:00.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "progress_bar.h"

using namespace std::chrono_literals;

namespace {

struct FakeClock {
  ProgressBar::Clock::time_point t{std::chrono::hours(1)};
  std::function<ProgressBar::Clock::time_point()> fn() {
    return [this] { return t; };
  }
};

// What the bar wrote, through open_memstream.
struct Sink {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ~Sink() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, len);
  }
};

std::string eta_of(const std::string& line) {
  size_t at = line.find("ETA ");
  return at == std::string::npos ? std::string() : line.substr(at + 4);
}

constexpr uint64_t MiB = 1 << 20;

}  // namespace

TEST_CASE("eta_text") {
  CHECK(ProgressBar::eta_text(0) == "0:00");
  CHECK(ProgressBar::eta_text(59.4) == "0:59");
  CHECK(ProgressBar::eta_text(65) == "1:05");
  CHECK(ProgressBar::eta_text(3599) == "59:59");
  CHECK(ProgressBar::eta_text(3723) == "1:02:03");
  CHECK(ProgressBar::eta_text(-1) == "--:--");
  CHECK(ProgressBar::eta_text(1.0 / 0.0) == "--:--");
  CHECK(ProgressBar::eta_text(0.0 / 0.0) == "--:--");
}

TEST_CASE("the ETA follows the phase's own rate") {
  FakeClock clock;
  Sink sink;
  REQUIRE(sink.f);
  ProgressBar bar(true, clock.fn(), sink.f);
  const uint64_t total = 1000 * MiB;

  bar.update("experts", 0, total);  // the phase's first call: no rate yet
  CHECK(eta_of(bar.line()) == "--:--");
  CHECK(bar.line().find("  -  ETA") != std::string::npos);

  clock.t += 10s;  // 100 MiB in 10 s: 10 MiB/s, 900 MiB left = 90 s
  bar.update("experts", 100 * MiB, total);
  CHECK(eta_of(bar.line()) == "1:30");
  CHECK(bar.line().find("10.00 MiB/s") != std::string::npos);

  clock.t += 40s;  // 500 MiB in 50 s: 500 MiB left = 50 s
  bar.update("experts", 500 * MiB, total);
  CHECK(eta_of(bar.line()) == "0:50");

  clock.t += 50ms;  // redrawn at most 10 times a second
  bar.update("experts", 501 * MiB, total);
  CHECK(eta_of(bar.line()) == "0:50");

  clock.t += 50s;
  bar.update("experts", total, total);
  CHECK(eta_of(bar.line()) == "0:00");
  CHECK(bar.line().find("100.0%") != std::string::npos);
  bar.finish();
  const std::string out = sink.text();
  CHECK(out.front() == '\r');
  CHECK(out.back() == '\n');
}

TEST_CASE("bytes of an earlier phase do not count in this phase's rate") {
  // xpack-build's count carries the trunk's bytes into the experts phase. Divided by
  // the experts' seconds they made the rate huge and the ETA 0:00.
  FakeClock clock;
  Sink sink;
  ProgressBar bar(true, clock.fn(), sink.f);
  const uint64_t total = 1100 * MiB;
  bar.update("trunk", 0, total);
  clock.t += 1s;
  bar.update("trunk", 100 * MiB, total);  // a fast trunk: 100 MiB/s
  CHECK(eta_of(bar.line()) == "0:10");  // 1000 MiB left
  bar.update("experts", 100 * MiB, total);  // experts begin with the trunk's 100 MiB done
  CHECK(eta_of(bar.line()) == "--:--");
  clock.t += 10s;  // 10 MiB of experts in 10 s: 1 MiB/s, 990 MiB left
  bar.update("experts", 110 * MiB, total);
  CHECK(eta_of(bar.line()) == "16:30");
  CHECK(bar.line().find("1.00 MiB/s") != std::string::npos);

  bar.update("verify", 0, 500 * MiB);  // a new phase starts its own count
  CHECK(eta_of(bar.line()) == "--:--");
  clock.t += 5s;
  bar.update("verify", 250 * MiB, 500 * MiB);
  CHECK(eta_of(bar.line()) == "0:05");
}

TEST_CASE("a disabled bar draws nothing") {
  FakeClock clock;
  Sink sink;
  ProgressBar bar(false, clock.fn(), sink.f);
  bar.update("experts", 0, 100);
  clock.t += 1s;
  bar.update("experts", 50, 100);
  bar.finish();
  CHECK(bar.line().empty());
  CHECK(sink.text().empty());
}

TEST_CASE("odd counts: nothing to do, done past total") {
  FakeClock clock;
  Sink sink;
  ProgressBar bar(true, clock.fn(), sink.f);
  bar.update("verify", 0, 0);
  CHECK(bar.line().find("100.0%") != std::string::npos);
  CHECK(eta_of(bar.line()) == "0:00");
  clock.t += 1s;
  bar.update("experts", 200, 100);
  CHECK(bar.line().find("100.0%") != std::string::npos);
  CHECK(eta_of(bar.line()) == "0:00");
}
