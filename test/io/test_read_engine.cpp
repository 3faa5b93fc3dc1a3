// The read engine against plain files with known content: placement, splits,
// depth, completion order, alignment checks, and every failure path.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <fcntl.h>
#include <sys/stat.h>
#include <random>
#include <thread>
#include <unistd.h>

#include "io/read_engine.h"
#include "io_test_util.h"

using namespace xpack;
using namespace xpack::io;
using xpack::test::TempDir;

namespace {

struct Layout {
  uint64_t object_bytes;  // aligned read length
  uint64_t stride;
  uint32_t objects;
};

EngineConfig config_for(const std::filesystem::path& file, const Layout& l, uint32_t slots,
                        uint32_t depth, uint32_t splits) {
  EngineConfig c;
  c.paths = {file.string()};
  c.slot_count = slots;
  c.slot_bytes = l.object_bytes;
  c.queue_depth = depth;
  c.read_splits = splits;
  return c;
}

std::unique_ptr<ReadEngine> make_engine(EngineConfig c) {
  auto e = ReadEngine::create(std::move(c));
  if (!e.ok()) FAIL("engine creation failed: " << e.error().message);
  return std::move(e).value();
}

std::vector<Completion> wait_all(ReadEngine& e, size_t n) {
  std::vector<Completion> out;
  while (out.size() < n) {
    auto r = e.poll(5000, &out);
    REQUIRE(r.ok());
    if (*r == 0) {
      FAIL("no completion within 5 s");
      break;
    }
  }
  return out;
}

// Reads every object in random order through `slots` slots, keeping all slots
// busy, and checks every completed slot byte by byte.
void read_all_objects(ReadEngine& e, const Layout& l, uint32_t seed) {
  std::vector<uint32_t> order(l.objects);
  for (uint32_t i = 0; i < l.objects; ++i) order[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<uint32_t> free_slots;
  for (uint32_t s = 0; s < e.slot_count(); ++s) free_slots.push_back(s);
  size_t next = 0, done = 0;
  while (done < l.objects) {
    std::vector<ReadRequest> batch;
    while (!free_slots.empty() && next < order.size()) {
      uint32_t obj = order[next++];
      batch.push_back({0, obj * l.stride, l.object_bytes, free_slots.back(), obj});
      free_slots.pop_back();
    }
    if (!batch.empty()) REQUIRE(e.submit(batch).ok());
    std::vector<Completion> out;
    auto r = e.poll(5000, &out);
    REQUIRE(r.ok());
    REQUIRE(*r > 0);
    for (const auto& c : out) {
      REQUIRE(c.status == 0);
      CHECK(c.bytes == l.object_bytes);
      CHECK(e.slot_state(c.slot) == SlotState::kReady);
      CHECK(xpack::test::matches_pattern(e.slot_data(c.slot), c.tag * l.stride, l.object_bytes));
      free_slots.push_back(c.slot);
      ++done;
    }
  }
  CHECK(e.objects_in_flight() == 0);
  CHECK(e.counters().objects_completed == l.objects);
  CHECK(e.counters().io_errors == 0);
  CHECK(e.counters().read_bytes == uint64_t(l.objects) * l.object_bytes);
  CHECK(e.counters().fallback_count == 0);
  CHECK(e.counters().latency.count() == l.objects);
}

}  // namespace

TEST_CASE("every object lands byte-exact in its slot: splits 1..7, depth 1 and 64") {
  TempDir dir;
  const Layout l{20 * 4096, 21 * 4096, 40};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  for (uint32_t splits : {1u, 2u, 3u, 4u, 7u}) {
    for (uint32_t depth : {1u, 64u}) {
      CAPTURE(splits);
      CAPTURE(depth);
      auto e = make_engine(config_for(file, l, 6, depth, splits));
      read_all_objects(*e, l, splits * 100 + depth);
      if (splits > 1) CHECK(e->counters().reads >= uint64_t(l.objects) * splits);
    }
  }
}

TEST_CASE("all I/O modes deliver the same bytes") {
  TempDir dir;
  const Layout l{8 * 4096, 8 * 4096, 24};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  struct Mode { bool fixed_buffers, fixed_files, sqpoll; };
  for (Mode m : {Mode{false, false, false}, Mode{true, false, false}, Mode{false, true, false},
                 Mode{true, true, true}}) {
    CAPTURE(m.fixed_buffers);
    CAPTURE(m.fixed_files);
    CAPTURE(m.sqpoll);
    auto c = config_for(file, l, 4, 16, 2);
    c.fixed_buffers = m.fixed_buffers;
    c.fixed_files = m.fixed_files;
    c.sqpoll = m.sqpoll;
    auto e = make_engine(c);
    if (m.sqpoll) CHECK((e->ring_flags() & IORING_SETUP_SQPOLL) != 0);
    read_all_objects(*e, l, 7);
  }
}

TEST_CASE("ring flags are the preferred ones this kernel accepts") {
  TempDir dir;
  auto file = xpack::test::make_pattern_file(dir, "f.bin", 8192);
  auto e = make_engine(config_for(file, {4096, 4096, 2}, 1, 4, 1));
  MESSAGE("ring flags: " << e->ring_description());
  CHECK((e->ring_flags() & (IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN)) != 0);
}

TEST_CASE("buffered mode is explicit and counted in fallback_count") {
  TempDir dir;
  const Layout l{4 * 4096, 4 * 4096, 10};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  auto c = config_for(file, l, 3, 8, 2);
  c.direct_io = false;
  auto e = make_engine(c);
  std::vector<ReadRequest> reqs;
  for (uint32_t s = 0; s < 3; ++s) reqs.push_back({0, s * l.stride, l.object_bytes, s, s});
  REQUIRE(e->submit(reqs).ok());
  auto out = wait_all(*e, 3);
  for (const auto& x : out) {
    CHECK(x.status == 0);
    CHECK(xpack::test::matches_pattern(e->slot_data(x.slot), x.tag * l.stride, l.object_bytes));
  }
  CHECK(e->counters().fallback_count == e->counters().reads);
  CHECK(e->counters().fallback_count >= 6);
}

TEST_CASE("completions are delivered in completion order, not submission order") {
  TempDir dir;
  const Layout l{4 * 4096, 4 * 4096, 4};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  // Object 0 is submitted first but its read is bounced with EAGAIN three times
  // (a retry queues behind waiting reads), so it finishes after object 1; with
  // depth 1 only one read is in flight, which makes the order deterministic.
  FaultPlan plan;
  plan.completions.push_back({/*tag*/ 100, /*split*/ -1, EAGAIN, 0, 3});
  auto c = config_for(file, l, 2, 1, 1);
  c.faults = &plan;
  auto e = make_engine(c);
  ReadRequest reqs[] = {{0, 0, l.object_bytes, 0, 100}, {0, l.stride, l.object_bytes, 1, 101}};
  REQUIRE(e->submit(reqs).ok());
  auto out = wait_all(*e, 2);
  REQUIRE(out.size() == 2);
  CHECK(out[0].tag == 101);
  CHECK(out[1].tag == 100);
  CHECK(out[1].status == 0);
  CHECK(e->counters().transient_retries == 3);
  CHECK(xpack::test::matches_pattern(e->slot_data(0), 0, l.object_bytes));
}

TEST_CASE("the callback sees each object as soon as it is complete") {
  TempDir dir;
  const Layout l{16 * 4096, 16 * 4096, 12};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  auto c = config_for(file, l, 12, 8, 4);
  ReadEngine* self = nullptr;
  int seen = 0;
  c.on_complete = [&](const Completion& x) {
    CHECK(x.status == 0);
    CHECK(self->slot_state(x.slot) == SlotState::kReady);
    CHECK(xpack::test::matches_pattern(self->slot_data(x.slot), x.tag * l.stride, l.object_bytes));
    ++seen;
  };
  auto e = make_engine(c);
  self = e.get();
  std::vector<ReadRequest> reqs;
  for (uint32_t s = 0; s < 12; ++s) reqs.push_back({0, s * l.stride, l.object_bytes, s, s});
  REQUIRE(e->submit(reqs).ok());
  int polls = 0;
  while (seen < 12 && polls++ < 1000) {
    auto r = e->poll(5000, nullptr);
    REQUIRE(r.ok());
  }
  CHECK(seen == 12);
}

TEST_CASE("misaligned or invalid requests are rejected before any I/O") {
  TempDir dir;
  const Layout l{4 * 4096, 4 * 4096, 4};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  auto e = make_engine(config_for(file, l, 2, 8, 1));
  auto code = [&](ReadRequest r) {
    auto st = e->submit(std::span<const ReadRequest>(&r, 1));
    return st.ok() ? 0 : st.error().code;
  };
  CHECK(code({0, 512, 4096, 0, 0}) == XPACK_E_MISALIGNED);       // offset
  CHECK(code({0, 0, 4096 + 512, 0, 0}) == XPACK_E_MISALIGNED);   // length
  CHECK(code({0, 0, 100, 0, 0}) == XPACK_E_MISALIGNED);
  CHECK(code({0, 0, 0, 0, 0}) == XPACK_E_INVALID_ARG);           // empty
  CHECK(code({0, 0, 5 * 4096, 0, 0}) == XPACK_E_INVALID_ARG);    // larger than a slot
  CHECK(code({0, 0, 4096, 2, 0}) == XPACK_E_INVALID_ARG);        // no such slot
  CHECK(code({1, 0, 4096, 0, 0}) == XPACK_E_INVALID_ARG);        // no such file
  CHECK(code({0, l.stride * l.objects, 4096, 0, 0}) == XPACK_E_INVALID_ARG);  // past EOF
  CHECK(code({0, UINT64_MAX - 4095, 4096, 0, 0}) == XPACK_E_INVALID_ARG);     // overflow
  // A batch with one bad request submits nothing.
  ReadRequest batch[] = {{0, 0, 4096, 0, 0}, {0, 4096, 4096, 1, 1}, {0, 7, 4096, 1, 2}};
  CHECK(!e->submit(batch).ok());
  CHECK(e->objects_in_flight() == 0);
  ReadRequest dup[] = {{0, 0, 4096, 0, 0}, {0, 4096, 4096, 0, 1}};
  CHECK(e->submit(dup).error().code == XPACK_E_INVALID_ARG);
  // A busy slot cannot be reused until its read finished.
  REQUIRE(code({0, 0, l.object_bytes, 0, 7}) == 0);
  CHECK(code({0, 0, l.object_bytes, 0, 8}) == XPACK_E_INVALID_ARG);
  auto out = wait_all(*e, 1);
  CHECK(out[0].tag == 7);
  CHECK(e->counters().objects_submitted == 1);
}

TEST_CASE("injected EIO fails that object only; the engine stays usable") {
  TempDir dir;
  const Layout l{8 * 4096, 8 * 4096, 6};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  FaultPlan plan;
  plan.completions.push_back({/*tag*/ 3, /*split*/ 1, EIO, 0, 1});
  auto c = config_for(file, l, 6, 4, 3);
  c.faults = &plan;
  auto e = make_engine(c);
  std::vector<ReadRequest> reqs;
  for (uint32_t s = 0; s < 6; ++s) reqs.push_back({0, s * l.stride, l.object_bytes, s, s});
  REQUIRE(e->submit(reqs).ok());
  auto out = wait_all(*e, 6);
  int failed = 0;
  for (const auto& x : out) {
    if (x.tag == 3) {
      CHECK(x.status == -EIO);
      CHECK(e->slot_state(x.slot) == SlotState::kFailed);
      ++failed;
    } else {
      CHECK(x.status == 0);
      CHECK(e->slot_state(x.slot) == SlotState::kReady);
    }
  }
  CHECK(failed == 1);
  CHECK(e->counters().io_errors == 1);
  CHECK(e->counters().objects_completed == 5);
  CHECK(e->last_failure().find("Input/output error") != std::string::npos);
  // Same slot again: the fault fired once, so this read succeeds.
  ReadRequest again{0, 3 * l.stride, l.object_bytes, 3, 3};
  REQUIRE(e->submit(std::span<const ReadRequest>(&again, 1)).ok());
  out = wait_all(*e, 1);
  CHECK(out[0].status == 0);
  CHECK(e->slot_state(3) == SlotState::kReady);
  CHECK(xpack::test::matches_pattern(e->slot_data(3), 3 * l.stride, l.object_bytes));
  CHECK(e->counters().io_errors == 1);
}

TEST_CASE("injected short reads are retried for the remainder") {
  TempDir dir;
  const Layout l{16 * 4096, 16 * 4096, 3};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  FaultPlan plan;
  plan.completions.push_back({/*tag*/ 1, -1, 0, /*short_by*/ 8192, /*times*/ 2});
  auto c = config_for(file, l, 3, 8, 2);
  c.faults = &plan;
  auto e = make_engine(c);
  std::vector<ReadRequest> reqs;
  for (uint32_t s = 0; s < 3; ++s) reqs.push_back({0, s * l.stride, l.object_bytes, s, s});
  REQUIRE(e->submit(reqs).ok());
  auto out = wait_all(*e, 3);
  for (const auto& x : out) {
    CHECK(x.status == 0);
    CHECK(x.bytes == l.object_bytes);
    CHECK(xpack::test::matches_pattern(e->slot_data(x.slot), x.tag * l.stride, l.object_bytes));
  }
  CHECK(e->counters().short_read_retries == 2);
  CHECK(e->counters().io_errors == 0);
}

TEST_CASE("an unaligned short O_DIRECT read is a truncation, not a loop") {
  TempDir dir;
  const Layout l{4 * 4096, 4 * 4096, 2};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  FaultPlan plan;
  plan.completions.push_back({/*tag*/ 0, -1, 0, /*short_by*/ 100, 1});
  auto c = config_for(file, l, 1, 8, 1);
  c.faults = &plan;
  auto e = make_engine(c);
  ReadRequest r{0, 0, l.object_bytes, 0, 0};
  REQUIRE(e->submit(std::span<const ReadRequest>(&r, 1)).ok());
  auto out = wait_all(*e, 1);
  CHECK(out[0].status == XPACK_E_TRUNCATED);
  CHECK(e->slot_state(0) == SlotState::kFailed);
  CHECK(e->counters().io_errors == 1);
}

TEST_CASE("a file truncated under the reader gives XPACK_E_TRUNCATED") {
  TempDir dir;
  const Layout l{8 * 4096, 8 * 4096, 4};
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", l.stride * l.objects);
  for (bool direct : {true, false}) {
    for (uint64_t cut : {uint64_t(3 * l.stride + 5 * 4096), uint64_t(3 * l.stride + 5 * 4096 + 123)}) {
      CAPTURE(direct);
      CAPTURE(cut);
      xpack::test::write_file(file, xpack::test::pattern_bytes(l.stride * l.objects, 1));
      auto c = config_for(file, l, 4, 8, 2);
      c.direct_io = direct;
      auto e = make_engine(c);
      REQUIRE(truncate(file.c_str(), static_cast<off_t>(cut)) == 0);
      std::vector<ReadRequest> reqs;
      for (uint32_t s = 0; s < 4; ++s) reqs.push_back({0, s * l.stride, l.object_bytes, s, s});
      REQUIRE(e->submit(reqs).ok());
      auto out = wait_all(*e, 4);
      for (const auto& x : out) {
        if (x.tag == 3) {
          CHECK(x.status == XPACK_E_TRUNCATED);
          CHECK(e->slot_state(x.slot) == SlotState::kFailed);
          CHECK(x.bytes < l.object_bytes);
        } else {
          CHECK(x.status == 0);
        }
      }
      CHECK(e->counters().io_errors == 1);
      CHECK(e->last_failure().find("end of file") != std::string::npos);
    }
  }
}

TEST_CASE("io_uring refused by the kernel gives XPACK_E_URING") {
  TempDir dir;
  auto file = xpack::test::make_pattern_file(dir, "f.bin", 8192);
  for (int e : {EPERM, ENOSYS}) {
    FaultPlan plan;
    plan.ring_setup_errno = e;
    auto c = config_for(file, {4096, 4096, 2}, 1, 4, 1);
    c.faults = &plan;
    auto r = ReadEngine::create(c);
    REQUIRE(!r.ok());
    CHECK(r.error().code == XPACK_E_URING);
    CHECK(r.error().message.find("io_uring_disabled") != std::string::npos);
    CHECK(r.error().message.find(strerror(e)) != std::string::npos);
  }
}

TEST_CASE("a filesystem without O_DIRECT gives XPACK_E_NO_DIRECT_IO") {
  TempDir dir;
  auto file = xpack::test::make_pattern_file(dir, "f.bin", 8192);
  FaultPlan plan;
  plan.open_direct_errno = EINVAL;  // what open(O_DIRECT) returns on such filesystems
  auto c = config_for(file, {4096, 4096, 2}, 1, 4, 1);
  c.faults = &plan;
  auto r = ReadEngine::create(c);
  REQUIRE(!r.ok());
  CHECK(r.error().code == XPACK_E_NO_DIRECT_IO);
  CHECK(r.error().message.find("XPACK_IO_BUFFERED") != std::string::npos);
  // Buffered mode was asked for explicitly: the open hook does not apply.
  c.direct_io = false;
  auto b = ReadEngine::create(c);
  CHECK(b.ok());
}

TEST_CASE("a real tmpfs file") {
  const char* shm = "/dev/shm";
  if (access(shm, W_OK) != 0) {
    MESSAGE("skipped: no writable /dev/shm");
    return;
  }
  std::string path = std::string(shm) + "/xpack-io-test-" + std::to_string(getpid());
  xpack::test::write_file(path, xpack::test::pattern_bytes(8192, 1));
  auto c = config_for(path, {4096, 4096, 2}, 1, 4, 1);
  auto r = ReadEngine::create(c);
  if (r.ok()) {
    // Linux >= 6.6 gives tmpfs O_DIRECT; the refusal path is covered by the hook above.
    MESSAGE("this kernel supports O_DIRECT on tmpfs; reading through it");
    ReadRequest req{0, 4096, 4096, 0, 1};
    REQUIRE((*r)->submit(std::span<const ReadRequest>(&req, 1)).ok());
    auto out = wait_all(**r, 1);
    CHECK(out[0].status == 0);
    CHECK(xpack::test::matches_pattern((*r)->slot_data(0), 4096, 4096));
  } else {
    CHECK(r.error().code == XPACK_E_NO_DIRECT_IO);
  }
  unlink(path.c_str());
}

TEST_CASE("the engine is single-issuer") {
  TempDir dir;
  const Layout l{4096, 4096, 4};
  auto file = xpack::test::make_pattern_file(dir, "f.bin", l.stride * l.objects);
  auto e = make_engine(config_for(file, l, 2, 4, 1));
  // Created here, first used by another thread: that thread becomes the issuer.
  int worker_code = -1;
  std::thread t([&] {
    ReadRequest r{0, 0, 4096, 0, 0};
    auto st = e->submit(std::span<const ReadRequest>(&r, 1));
    worker_code = st.ok() ? 0 : st.error().code;
    if (st.ok()) {
      std::vector<Completion> out;
      while (out.empty()) {
        auto p = e->poll(5000, &out);
        if (!p.ok()) break;
      }
    }
  });
  t.join();
  CHECK(worker_code == 0);
  CHECK(e->slot_state(0) == SlotState::kReady);
  std::vector<Completion> out;
  auto p = e->poll(0, &out);
  REQUIRE(!p.ok());
  CHECK(p.error().code == XPACK_E_INVALID_ARG);
}

TEST_CASE("poll timeouts and an idle engine") {
  TempDir dir;
  auto file = xpack::test::make_pattern_file(dir, "f.bin", 8192);
  auto e = make_engine(config_for(file, {4096, 4096, 2}, 1, 4, 1));
  std::vector<Completion> out;
  auto r = e->poll(-1, &out);  // nothing in flight: returns at once
  REQUIRE(r.ok());
  CHECK(*r == 0);
  r = e->poll(20, &out);
  REQUIRE(r.ok());
  CHECK(*r == 0);
}

TEST_CASE("wake() ends a blocking poll while a read is still in flight") {
  // A FIFO gives a read that cannot finish until the test writes: the issuer is
  // then blocked in the kernel, which is where wake() must reach it.
  TempDir dir;
  auto fifo = dir.path() / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int writer = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // O_RDWR: open does not block
  REQUIRE(writer >= 0);
  EngineConfig c = config_for(fifo, {4096, 4096, 1}, 1, 4, 1);
  c.direct_io = false;
  c.wakeable = true;
  auto e = make_engine(c);
  std::vector<ReadRequest> reqs{{0, 0, 4096, 0, 7}};
  REQUIRE(e->submit(reqs).ok());

  for (int round = 0; round < 3; ++round) {  // the wake-up re-arms itself
    auto t0 = std::chrono::steady_clock::now();
    std::thread waker([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      e->wake();
    });
    std::vector<Completion> out;
    auto r = e->poll(-1, &out);
    waker.join();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
    REQUIRE(r.ok());
    CHECK(*r == 0);
    CHECK(e->woken());
    CHECK(e->objects_in_flight() == 1);
    CHECK(ms >= 25);
    CHECK(ms < 2000);
  }
  // A wake-up that comes before the poll is not lost either.
  e->wake();
  std::vector<Completion> out;
  auto r = e->poll(-1, &out);
  REQUIRE(r.ok());
  CHECK(*r == 0);
  CHECK(e->woken());

  std::vector<uint8_t> data(4096, 0x5a);
  REQUIRE(::write(writer, data.data(), data.size()) == ssize_t(data.size()));
  auto done = wait_all(*e, 1);
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == 0);
  CHECK(done[0].tag == 7);
  CHECK(e->slot_data(0)[4095] == 0x5a);
  CHECK_FALSE(e->woken());
  ::close(writer);
}

TEST_CASE("wake() on an engine that is not wakeable is a no-op") {
  TempDir dir;
  auto file = xpack::test::make_pattern_file(dir, "f.bin", 8192);
  auto e = make_engine(config_for(file, {4096, 4096, 2}, 1, 4, 1));
  e->wake();
  std::vector<Completion> out;
  auto r = e->poll(0, &out);
  REQUIRE(r.ok());
  CHECK_FALSE(e->woken());
}

TEST_CASE("destroying an engine with reads in flight") {
  TempDir dir;
  const Layout l{64 * 4096, 64 * 4096, 8};
  auto file = xpack::test::make_pattern_file(dir, "f.bin", l.stride * l.objects);
  auto e = make_engine(config_for(file, l, 8, 4, 4));
  std::vector<ReadRequest> reqs;
  for (uint32_t s = 0; s < 8; ++s) reqs.push_back({0, s * l.stride, l.object_bytes, s, s});
  REQUIRE(e->submit(reqs).ok());
  // Nothing was reaped, so every object is still owned by the kernel or the CQ:
  // the destructor must wait for them before unmapping the slots (ASan/TSan runs
  // of this suite would flag writes into freed memory).
  CHECK(e->objects_in_flight() == 8);
  e.reset();
}

TEST_CASE("engine configuration limits") {
  TempDir dir;
  auto file = xpack::test::make_pattern_file(dir, "f.bin", 8192);
  auto base = config_for(file, {4096, 4096, 2}, 1, 4, 1);
  auto code = [](EngineConfig c) {
    auto r = ReadEngine::create(std::move(c));
    return r.ok() ? 0 : r.error().code;
  };
  auto c = base; c.slot_count = 0; CHECK(code(c) == XPACK_E_INVALID_ARG);
  c = base; c.slot_bytes = 0; CHECK(code(c) == XPACK_E_INVALID_ARG);
  c = base; c.queue_depth = 0; CHECK(code(c) == XPACK_E_INVALID_ARG);
  c = base; c.queue_depth = 100000; CHECK(code(c) == XPACK_E_INVALID_ARG);
  c = base; c.read_splits = 0; CHECK(code(c) == XPACK_E_INVALID_ARG);
  c = base; c.paths = {}; CHECK(code(c) == XPACK_E_INVALID_ARG);
  c = base; c.paths = {(dir / "missing").string()}; CHECK(code(c) == -ENOENT);
  c = base; c.slot_bytes = 1ull << 50; CHECK(code(c) == XPACK_E_LIMIT);
}
