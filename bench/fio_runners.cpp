#include "fio_runners.h"

#include <atomic>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <memory>
#include <sys/mman.h>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>

#include "device/device.h"
#include "io/device_registrar.h"
#include "io/read_engine.h"
#include "io/staging_arena.h"

namespace xpack::bench {

namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

double cpu_now() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Clock {
  uint64_t start = now_ns();
  uint64_t deadline = 0;
  explicit Clock(const RunLimits& lim) {
    if (lim.runtime_s > 0) deadline = start + uint64_t(lim.runtime_s * 1e9);
  }
  bool expired() const { return deadline != 0 && now_ns() >= deadline; }
};

void record_pages(RunResult& r, const io::StagingArena& a) {
  r.page_bytes = a.page_bytes();
  r.huge_fraction = a.huge_fraction();
  r.pages = a.page_description();
  r.huge_wanted = a.huge_wanted();
}

}  // namespace

uint64_t Workload::offset(uint64_t i) const {
  if (!offsets.empty()) return offsets[i % offsets.size()];
  uint64_t block = random ? mix(i * 0x9E3779B97F4A7C15ull + 12345) % nblocks : i % nblocks;
  return block * bs;
}

Result<RunResult> run_threaded(const Workload& w, const RunLimits& lim, uint32_t threads,
                               bool direct, bool huge_pages) {
  int fd = ::open(w.path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) {
    if (direct && errno == EINVAL)
      return err(XPACK_E_NO_DIRECT_IO, "{}: the filesystem refuses O_DIRECT", w.path);
    return errno_error("open {}", w.path);
  }
  // As fio does for buffered I/O: tell the kernel the access pattern, so random
  // reads are not inflated by readahead. (Blocks read twice in one run still hit
  // the page cache; use a file larger than what a run reads.)
  const bool random_order = w.random || !w.offsets.empty();
  if (!direct) posix_fadvise(fd, 0, 0, random_order ? POSIX_FADV_RANDOM : POSIX_FADV_SEQUENTIAL);
  // The destination is pinned staging memory, as in the engine.
  io::ArenaConfig ac;
  ac.slot_count = threads;
  ac.slot_bytes = w.bs;
  ac.huge_pages = huge_pages;
  auto arena = io::StagingArena::create(ac);
  if (!arena.ok()) {
    close(fd);
    return std::move(arena).error();
  }
  mlock((*arena)->base(), (*arena)->total_bytes());  // best effort: "pinned" as the seed's

  std::atomic<uint64_t> next{0};
  std::atomic<int> first_error{0};
  std::vector<LatencyHistogram> hists(threads);
  std::vector<uint64_t> bytes(threads, 0);
  Clock clock(lim);
  double cpu0 = cpu_now();
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint8_t* dest = (*arena)->slot(t);
      std::unique_ptr<uint8_t[]> bounce;
      if (!direct) bounce.reset(new uint8_t[w.bs]);
      uint8_t* target = direct ? dest : bounce.get();
      for (;;) {
        uint64_t i = next.fetch_add(1);
        if ((lim.ios && i >= lim.ios) || clock.expired() || first_error.load()) break;
        uint64_t off = w.offset(i);
        uint64_t t0 = now_ns();
        uint64_t got = 0;
        while (got < w.bs) {
          ssize_t n = pread(fd, target + got, w.bs - got, static_cast<off_t>(off + got));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            int zero = 0;
            first_error.compare_exchange_strong(zero, n < 0 ? -errno : XPACK_E_TRUNCATED);
            break;
          }
          got += uint64_t(n);
        }
        if (got < w.bs) break;
        if (!direct) std::memcpy(dest, bounce.get(), w.bs);
        hists[t].record(now_ns() - t0);
        bytes[t] += w.payload;
      }
    });
  }
  for (auto& th : pool) th.join();
  RunResult r;
  r.seconds = double(now_ns() - clock.start) * 1e-9;
  r.cpu_seconds = cpu_now() - cpu0;
  record_pages(r, **arena);
  close(fd);
  if (int e = first_error.load())
    return err(e, "read of {} failed: {}", w.path, xpack_strerror(e));
  for (uint32_t t = 0; t < threads; ++t) {
    r.latency.merge(hists[t]);
    r.bytes += bytes[t];
  }
  r.ios = r.latency.count();
  return r;
}

Result<RunResult> run_uring(const Workload& w, const RunLimits& lim, uint32_t qd, bool fixed,
                            bool sqpoll, uint32_t splits, device::Device* h2d,
                            bool huge_pages) {
  io::EngineConfig c;
  c.paths = {w.path};
  c.slot_count = qd;
  c.slot_bytes = w.bs;
  c.queue_depth = std::max<uint32_t>(qd, 1) * splits;
  c.read_splits = splits;
  c.fixed_buffers = fixed || sqpoll;
  c.fixed_files = fixed || sqpoll;
  c.sqpoll = sqpoll;
  c.huge_pages = huge_pages;
  std::unique_ptr<io::DeviceHostRegistrar> registrar;
  if (h2d) {
    registrar = std::make_unique<io::DeviceHostRegistrar>(*h2d);
    c.registrar = registrar.get();
  }
  XPACK_ASSIGN_OR_RETURN(auto engine, io::ReadEngine::create(c));

  // Device side of --h2d: one device buffer per slot and an event per slot; a
  // slot is reused only after its copy finished.
  void* dev = nullptr;
  std::vector<std::unique_ptr<device::Event>> events;
  std::vector<bool> copying(qd, false);
  if (h2d) {
    XPACK_ASSIGN_OR_RETURN(dev, h2d->allocate(size_t(w.bs) * qd));
    for (uint32_t s = 0; s < qd; ++s) {
      XPACK_ASSIGN_OR_RETURN(auto ev, h2d->create_event());
      events.push_back(std::move(ev));
    }
  }
  auto cleanup = [&] {
    if (dev) {
      (void)h2d->synchronize();
      h2d->deallocate(dev);
    }
  };

  RunResult r;
  r.ring_flags = engine->ring_description();
  record_pages(r, engine->arena());
  std::vector<uint32_t> free_slots;
  for (uint32_t s = 0; s < qd; ++s) free_slots.push_back(qd - 1 - s);
  std::vector<io::ReadRequest> batch;
  std::vector<io::Completion> done;
  uint64_t issued = 0;
  bool stop = false;
  Clock clock(lim);
  double cpu0 = cpu_now();
  for (;;) {
    if (h2d) {
      for (uint32_t s = 0; s < qd; ++s) {
        if (!copying[s]) continue;
        auto q = events[s]->query();
        if (!q.ok()) { cleanup(); return std::move(q).error(); }
        if (*q) { copying[s] = false; free_slots.push_back(s); }
      }
    }
    stop = stop || (lim.ios && issued >= lim.ios) || clock.expired();
    batch.clear();
    while (!stop && !free_slots.empty() && !(lim.ios && issued >= lim.ios)) {
      uint32_t s = free_slots.back();
      free_slots.pop_back();
      batch.push_back({0, w.offset(issued), w.bs, s, issued});
      ++issued;
    }
    if (!batch.empty()) {
      auto st = engine->submit(batch);
      if (!st.ok()) { cleanup(); return std::move(st).error(); }
    }
    if (engine->objects_in_flight() == 0) {
      bool any_copy = false;
      for (bool b : copying) any_copy |= b;
      if (!any_copy && (stop || (lim.ios && issued >= lim.ios))) break;
      if (any_copy && free_slots.empty()) {
        for (uint32_t s = 0; s < qd; ++s)
          if (copying[s]) { (void)events[s]->wait(); break; }
      }
      continue;
    }
    done.clear();
    auto p = engine->poll(h2d ? 1 : -1, &done);
    if (!p.ok()) { cleanup(); return std::move(p).error(); }
    for (const auto& d : done) {
      if (d.status != 0) {
        cleanup();
        return err(d.status, "{}", engine->last_failure());
      }
      r.bytes += w.payload;
      if (h2d) {
        auto st = h2d->copy_to_device_async(static_cast<uint8_t*>(dev) + uint64_t(d.slot) * w.bs,
                                            engine->slot_data(d.slot), w.payload,
                                            events[d.slot].get());
        if (!st.ok()) { cleanup(); return std::move(st).error(); }
        copying[d.slot] = true;
        r.h2d_bytes += w.payload;
      } else {
        free_slots.push_back(d.slot);
      }
    }
  }
  if (h2d) {
    auto st = h2d->synchronize();
    if (!st.ok()) { cleanup(); return std::move(st).error(); }
  }
  r.seconds = double(now_ns() - clock.start) * 1e-9;
  r.cpu_seconds = cpu_now() - cpu0;
  r.latency = engine->counters().latency;
  r.ios = r.latency.count();
  cleanup();
  engine.reset();  // before the registrar it uses
  return r;
}

}  // namespace xpack::bench
