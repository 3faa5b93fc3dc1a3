// xpack-fio's read paths on a small file with known content: every mode reads
// the requested number of blocks, and the --h2d path (run here on the host
// device backend) copies exactly what was read.
#include <doctest/doctest.h>

#include <cstring>

#include "device/device.h"
#include "fio_runners.h"
#include "io_test_util.h"

using namespace xpack;
using namespace xpack::bench;
using xpack::test::TempDir;

namespace {
Workload small_workload(const std::filesystem::path& file, uint64_t bs, uint64_t nblocks,
                        bool random) {
  Workload w;
  w.path = file.string();
  w.bs = bs;
  w.payload = bs;
  w.nblocks = nblocks;
  w.random = random;
  return w;
}
}  // namespace

TEST_CASE("workload offsets") {
  Workload w = small_workload("x", 8192, 10, false);
  for (uint64_t i = 0; i < 30; ++i) CHECK(w.offset(i) == (i % 10) * 8192);
  w.random = true;
  std::vector<int> hits(10, 0);
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t off = w.offset(i);
    REQUIRE(off % 8192 == 0);
    REQUIRE(off / 8192 < 10);
    ++hits[off / 8192];
  }
  for (int h : hits) CHECK(h > 50);  // roughly uniform, every block visited
  w.offsets = {4096, 12288};
  CHECK(w.offset(0) == 4096);
  CHECK(w.offset(3) == 12288);
}

TEST_CASE("every mode reads the requested number of blocks") {
  TempDir dir;
  const uint64_t bs = 64 * 1024, nblocks = 32;
  auto file = xpack::test::make_pattern_file(dir, "bench.bin", bs * nblocks);
  auto w = small_workload(file, bs, nblocks, true);
  RunLimits lim{0, 100};
  for (bool direct : {false, true}) {
    auto r = run_threaded(w, lim, 4, direct);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    CHECK(r->ios == 100);
    CHECK(r->bytes == 100 * bs);
    CHECK(r->cpu_seconds >= 0);
  }
  struct Mode { bool fixed, sqpoll; };
  for (Mode m : {Mode{false, false}, Mode{true, false}, Mode{true, true}}) {
    auto r = run_uring(w, lim, 8, m.fixed, m.sqpoll, 2, nullptr);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    CHECK(r->ios == 100);
    CHECK(r->bytes == 100 * bs);
    CHECK(!r->ring_flags.empty());
  }
}

TEST_CASE("a runtime limit stops a run") {
  TempDir dir;
  const uint64_t bs = 4096, nblocks = 256;
  auto file = xpack::test::make_pattern_file(dir, "bench.bin", bs * nblocks);
  auto w = small_workload(file, bs, nblocks, false);
  auto r = run_uring(w, RunLimits{0.2, 0}, 4, true, false, 1, nullptr);
  REQUIRE(r.ok());
  CHECK(r->seconds >= 0.2);
  CHECK(r->seconds < 5);
  CHECK(r->ios > 0);
}

TEST_CASE("--h2d path copies every block read (host device backend)") {
  TempDir dir;
  const uint64_t bs = 16 * 4096, nblocks = 16;
  auto file = xpack::test::make_pattern_file(dir, "bench.bin", bs * nblocks);
  auto w = small_workload(file, bs, nblocks, false);
  xpack::device::HostDeviceOptions ho;
  ho.copy_bytes_per_second = 200ull << 20;  // slow copies: slots must wait for them
  auto dev = xpack::device::make_host_device(ho);
  auto r = run_uring(w, RunLimits{0, 40}, 4, true, false, 1, dev.get());
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  CHECK(r->ios == 40);
  CHECK(r->h2d_bytes == 40 * bs);
}

TEST_CASE("a truncated file fails the run instead of looping") {
  TempDir dir;
  const uint64_t bs = 8192;
  auto file = xpack::test::make_pattern_file(dir, "bench.bin", bs * 4);
  auto w = small_workload(file, bs, 8, false);  // claims 8 blocks, the file has 4
  auto t = run_threaded(w, RunLimits{0, 8}, 2, true);
  CHECK(!t.ok());
  auto u = run_uring(w, RunLimits{0, 8}, 2, true, false, 1, nullptr);
  REQUIRE(!u.ok());
}
