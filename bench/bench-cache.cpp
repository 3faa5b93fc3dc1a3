// bench-cache: how close the cache's miss delivery (SSD -> staging -> device
// slot) comes to the slower of the two links it chains, measured in the same run:
//   disk  = io_uring O_DIRECT reads of the same objects into staging, no copies,
//           with the cache's staging count, read splits and queue depth (so at
//           most the same bytes in flight)
//   pcie  = pinned host -> device copies of one object, back to back (once)
//   cache = acquire() of never-seen experts (every request a miss), wait_all
// The disk drifts by tens of percent within one run (virtio), so disk and cache
// passes are interleaved: D0 C0 D1 C1 ... C(R-1) DR, and round r compares C(r)
// with the mean of the disk passes on either side of it. The median of the
// per-round ratios is the headline; min, max and a pooled ratio show the spread.
// Every timed pass starts the same idle time (--gap-ms) after the previous one,
// so a disk that banks idle time as burst credit favours no pass.
// Prints JSON.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "cache/expert_cache.h"
#include "common/checked_math.h"
#include "io/read_engine.h"
#include "cli_app.h"
#include "small_pages_warning.h"

using namespace xpack;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string file;  // required: a benchmark never starts from a bare command
  std::string device = "auto";
  uint64_t object_bytes = 13'369'344;  // DeepSeek-V4-Flash MXFP4 expert
  uint32_t objects = 192;              // ~2.6 GB: one pass ~1.3 s at 2 GB/s
  uint32_t per_request = 6;            // top-k
  uint32_t staging = 12;
  uint32_t splits = 4;
  uint32_t queue_depth = 64;
  // Requests acquired before the oldest is waited for: 1 = the runtime's worst
  // case (next layer unknown until this one ran), 2+ = keeps the disk queue full.
  uint32_t outstanding = 2;
  uint32_t rounds = 5;
  uint32_t pcie_copies = 64;
  uint32_t gap_ms = 200;
  bool keep = false;
  bool disk_spin = false;
  bool verify = false;
};

const char kAbout[] =
    "Measures, in one run, the disk (io_uring O_DIRECT into staging), PCIe (pinned\n"
    "H2D) and the expert cache's all-miss delivery rate, and prints JSON with\n"
    "ratio = cache / min(disk, pcie) and the stall per miss.\n"
    "\n"
    "The disk and cache passes are interleaved: disk, cache, disk, cache, ..., disk.\n"
    "Round r compares cache pass r with the mean of the disk passes just before and\n"
    "just after it; ratio_vs_min_disk_pcie is the median over rounds. Each round\n"
    "uses a new cache (created and destroyed outside the timed region), so every\n"
    "acquire is a miss; the run fails if any request hits. The disk pass reads the\n"
    "same objects with the same staging buffers, splits and queue depth as the cache.";

// nullopt: run; otherwise the exit status (help, version, a bad command line).
std::optional<int> parse(int argc, char** argv, Args* a) {
  cli::App app("bench-cache", "bench-cache --file PATH [options]", kAbout,
               "exit status: 0 ok, 1 measurement failed, 2 bad arguments");
  app.text("--file", "PATH", &a->file,
           "object file (required). Created with a pattern unless it already has exactly\n"
           "objects x stride bytes (stride = object bytes rounded up to 4096); a file of\n"
           "another size is OVERWRITTEN. Creation is not timed.")
      ->required();
  app.choice("--device", "D", &a->device, {"auto", "cuda", "host"},
             "auto (CUDA if available, else host), cuda, host (default auto)");
  app.size("--object-bytes", "SIZE", &a->object_bytes, "bytes per object, at most 1G (default 13369344)", 1, 1,
           uint64_t{1} << 30);
  app.count("--objects", "N", &a->objects,
            "objects in the file (default 192); every pass covers\n"
            "floor(objects / per-request) x per-request of them",
            1, 1u << 24);
  app.count("--per-request", "K", &a->per_request, "experts per acquire (top-k; default 6)", 1, 1u << 16);
  app.count("--staging", "N", &a->staging, "staging buffers, for the cache and the disk pass (default 12)", 1,
            4096);
  app.count("--splits", "N", &a->splits, "reads each object is split into (default 4)", 1, 256);
  app.count("--qd", "N", &a->queue_depth, "io_uring queue depth (default 64)", 1, 4096);
  app.count("--outstanding", "N", &a->outstanding,
            "requests acquired before the oldest is waited for\n"
            "(default 2; 1 = next layer unknown until this one ran)",
            1, 4096);
  app.count("--rounds", "N", &a->rounds, "disk+cache rounds (default 5); one more disk pass follows", 1, 1000);
  app.count("--pcie-copies", "N", &a->pcie_copies, "back-to-back H2D copies for the PCIe rate (default 64)", 1,
            1u << 20);
  app.count("--gap-ms", "MS", &a->gap_ms,
            "idle time of the disk before every timed pass, 0 allowed (default 200).\n"
            "Setting up a pass (engine, cache, pinning) happens inside the gap, so every\n"
            "pass, disk or cache, starts after the same idle time: a disk with burst\n"
            "credits (cloud/virtio throttling) would otherwise favour the passes that\n"
            "follow a longer setup. Each pass reports its idle time (idle_before_s).",
            0, 60'000);
  app.flag("--disk-spin", &a->disk_spin,
           "the disk pass polls for completions without sleeping\n"
           "(default: it sleeps in io_uring until one arrives)");
  app.flag("--verify", &a->verify,
           "the cache checks each object's xxh3-64 on arrival, as the C API does by\n"
           "default (the checksums are computed before the first pass, untimed)");
  app.flag("--keep", &a->keep, "keep the file afterwards (default: delete it)");
  if (auto rc = app.parse(argc, argv)) return rc;
  if (a->file.empty()) return app.usage_error("--file: empty path");
  if (a->objects < a->per_request)
    return app.usage_error("--objects (" + std::to_string(a->objects) + ") must be at least --per-request (" +
                           std::to_string(a->per_request) + ")");
  if (!checked_mul(align_up(a->object_bytes, 4096), a->objects))
    return app.usage_error("--objects x --object-bytes overflows");
  return std::nullopt;
}

Status ensure_file(const Args& a, uint64_t stride) {
  uint64_t want = stride * a.objects;
  struct stat st{};
  if (::stat(a.file.c_str(), &st) == 0 && uint64_t(st.st_size) == want) return {};
  // Refuse before truncating anything if the file cannot fit.
  std::string dir = a.file.find('/') == std::string::npos
                        ? std::string(".")
                        : a.file.substr(0, a.file.rfind('/') + 1);
  struct statvfs vfs{};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    uint64_t have = uint64_t(vfs.f_bavail) * vfs.f_frsize;
    if (::stat(a.file.c_str(), &st) == 0) have += uint64_t(st.st_size);
    if (want > have)
      return err(XPACK_E_LIMIT, "{} needs {} bytes, the file system has {} free", a.file, want,
                 have);
  }
  int fd = ::open(a.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return errno_error("create {}", a.file);
  std::vector<uint8_t> buf(stride);
  for (uint32_t o = 0; o < a.objects; ++o) {
    for (uint64_t i = 0; i < stride; i += 8) {
      uint64_t x = (uint64_t(o) << 40) ^ (i * 0x9E3779B97F4A7C15ull);
      std::memcpy(&buf[i], &x, 8);
    }
    if (::write(fd, buf.data(), stride) != ssize_t(stride)) {
      ::close(fd);
      return errno_error("write {}", a.file);
    }
  }
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return {};
}

// Starts every timed pass the same idle time after the previous one ended.
class Pacer {
 public:
  explicit Pacer(uint32_t gap_ms) : gap_s_(gap_ms / 1e3), last_end_(now_s()) {}
  // Waits out the rest of the gap; returns the start time.
  double start() {
    double until = last_end_ + gap_s_;
    for (double t = now_s(); t < until; t = now_s())
      std::this_thread::sleep_for(std::chrono::duration<double>(until - t));
    double t0 = now_s();
    idle_ = t0 - last_end_;
    return t0;
  }
  double end() { return last_end_ = now_s(); }
  double idle() const { return idle_; }

 private:
  double gap_s_;
  double last_end_;
  double idle_ = 0;
};

struct Pass {
  double bytes = 0;  // object bytes (not padded stride), as the cache counts them
  double secs = 0;
  double idle_before_s = 0;  // disk idle time before the pass started
  double gbps() const { return secs > 0 ? bytes / secs / 1e9 : 0.0; }
};

// Reads objects [0, n) once into the staging buffers, keeping every buffer busy:
// the same bytes-in-flight limit the cache has.
Result<Pass> disk_pass(const Args& a, const cache::ObjectSource& src, uint32_t n,
                       Pacer& pacer) {
  io::EngineConfig ec;
  ec.paths = {src.path};
  ec.slot_count = a.staging;
  ec.slot_bytes = src.read_bytes;
  ec.queue_depth = a.queue_depth;
  ec.read_splits = a.splits;
  XPACK_ASSIGN_OR_RETURN(auto eng, io::ReadEngine::create(std::move(ec)));
  std::vector<io::Completion> done;
  uint32_t next = 0, finished = 0;
  std::vector<uint32_t> free_slots;
  for (uint32_t s = 0; s < a.staging; ++s) free_slots.push_back(s);
  double t0 = pacer.start();
  while (finished < n) {
    std::vector<io::ReadRequest> batch;
    while (!free_slots.empty() && next < n) {
      uint32_t s = free_slots.back();
      free_slots.pop_back();
      batch.push_back({0, src.offset(0, next), src.read_bytes, s, next});
      ++next;
    }
    if (!batch.empty()) XPACK_TRY(eng->submit(batch));
    done.clear();
    XPACK_ASSIGN_OR_RETURN(size_t got, eng->poll(a.disk_spin ? 0 : -1, &done));
    (void)got;
    for (auto& c : done) {
      if (c.status != 0) return err(c.status, "disk read failed: {}", eng->last_failure());
      free_slots.push_back(c.slot);
      ++finished;
    }
  }
  return Pass{double(n) * double(src.object_bytes), pacer.end() - t0, pacer.idle()};
}

Result<double> pcie_rate(device::Device& dev, uint64_t bytes, uint32_t n) {
  std::vector<uint8_t> host(align_up(bytes, 4096) + 4096);
  uint8_t* h = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(host.data()), 4096));
  XPACK_TRY(dev.register_host(h, align_up(bytes, 4096)));
  XPACK_ASSIGN_OR_RETURN(void* d, dev.allocate(bytes));
  XPACK_TRY(dev.copy_to_device_async(d, h, bytes, nullptr));  // warm up
  XPACK_TRY(dev.synchronize());
  double t0 = now_s();
  for (uint32_t i = 0; i < n; ++i) XPACK_TRY(dev.copy_to_device_async(d, h, bytes, nullptr));
  XPACK_TRY(dev.synchronize());
  double rate = double(n) * double(bytes) / (now_s() - t0) / 1e9;
  dev.deallocate(d);
  dev.unregister_host(h);
  return rate;
}

struct CacheRound {
  Pass pass;  // bytes = h2d bytes the cache delivered
  uint32_t requests = 0;
  stats::Counters counters;
};

// One pass of every object through a new cache, per_request at a time, up to
// `outstanding` requests in flight before the oldest is waited for. Only the
// requests are timed: creating the cache (staging pinning, slot allocation) and
// destroying it are not.
Result<CacheRound> cache_pass(const Args& a, const cache::ObjectSource& src,
                              device::Device& dev, uint32_t n, Pacer& pacer) {
  cache::CacheOptions co;
  co.budget_bytes = uint64_t(a.per_request) * (a.outstanding + 2) * align_up(a.object_bytes, 256);
  co.staging_slots = a.staging;
  co.read_splits = a.splits;
  co.queue_depth = a.queue_depth;
  co.policy = cache::PolicyKind::kLru;
  co.verify = a.verify;
  XPACK_ASSIGN_OR_RETURN(auto c, cache::ExpertCache::create(src, dev, co));
  CacheRound out;
  std::deque<cache::TicketId> inflight;
  auto finish_oldest = [&]() -> Status {
    cache::TicketId t = inflight.front();
    inflight.pop_front();
    Status waited = c->wait_all(t);
    Status released = c->release(t);
    if (!waited.ok()) return waited;
    return released;
  };
  std::vector<uint32_t> ids(a.per_request);
  double t0 = pacer.start();
  for (uint32_t first = 0; first + a.per_request <= n; first += a.per_request) {
    for (uint32_t i = 0; i < a.per_request; ++i) ids[i] = first + i;
    XPACK_ASSIGN_OR_RETURN(auto got, c->acquire(0, ids.data(), ids.size()));
    inflight.push_back(got.ticket);
    ++out.requests;
    if (inflight.size() >= a.outstanding) XPACK_TRY(finish_oldest());
  }
  while (!inflight.empty()) XPACK_TRY(finish_oldest());
  out.pass.secs = pacer.end() - t0;
  out.pass.idle_before_s = pacer.idle();
  out.counters = c->counters();
  out.pass.bytes = double(out.counters.h2d_bytes);
  uint64_t want_bytes = uint64_t(n) * src.object_bytes;
  if (out.counters.cache_hits != 0 || out.counters.cache_misses != n ||
      out.counters.h2d_bytes != want_bytes || out.counters.io_errors != 0)
    return err(XPACK_E_INTERNAL,
               "not an all-miss pass: {} hits, {} misses (want {}), {} h2d bytes (want {}), "
               "{} io errors",
               out.counters.cache_hits, out.counters.cache_misses, n, out.counters.h2d_bytes,
               want_bytes, out.counters.io_errors);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Quantile upper bound of several histograms together (LatencyHistogram::quantile_ns).
double merged_quantile_ms(const std::vector<const LatencyHistogram*>& hs, double q) {
  LatencyHistogram all;
  for (auto* h : hs) all.merge(*h);
  return double(all.quantile_ns(q)) / 1e6;
}

int fail(const char* what, const Error& e) {
  std::fprintf(stderr, "bench-cache: %s: %s\n", what, e.message.c_str());
  return 1;
}

// xxh3-64 of every object's payload, read once through the page cache (untimed).
Result<std::vector<uint64_t>> object_checksums(const Args& a, uint64_t stride) {
  int fd = ::open(a.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_error("open {}", a.file);
  std::vector<uint8_t> buf(a.object_bytes);
  std::vector<uint64_t> sums(a.objects);
  for (uint32_t e = 0; e < a.objects; ++e) {
    if (::pread(fd, buf.data(), buf.size(), off_t(uint64_t(e) * stride)) != ssize_t(buf.size())) {
      Error err = errno_error("read {}", a.file);
      ::close(fd);
      return err;
    }
    sums[e] = XXH3_64bits(buf.data(), buf.size());
  }
  ::close(fd);
  return sums;
}

int run(const Args& a) {
  uint64_t stride = align_up(a.object_bytes, 4096);
  if (auto st = ensure_file(a, stride); !st.ok()) return fail("file", st.error());
  // Disk and cache passes cover the same objects: whole requests only.
  const uint32_t used = a.objects / a.per_request * a.per_request;
  cache::ObjectSource src;
  src.path = a.file;
  src.n_layers = 1;
  src.n_experts = a.objects;
  src.top_k = a.per_request;
  src.object_bytes = a.object_bytes;
  src.read_bytes = stride;
  src.offset = [stride](uint32_t, uint32_t e) { return uint64_t(e) * stride; };
  if (a.verify) {
    auto sums = object_checksums(a, stride);
    if (!sums.ok()) return fail("checksums", sums.error());
    src.checksum = [s = std::move(*sums)](uint32_t, uint32_t e) { return s[e]; };
  }

  std::unique_ptr<device::Device> dev;
  if (a.device != "host") {
    auto d = device::make_cuda_device(0);
    if (d.ok()) dev = std::move(*d);
    else if (a.device == "cuda") return fail("cuda", d.error());
  }
  if (!dev) dev = device::make_host_device();

  auto pcie = pcie_rate(*dev, a.object_bytes, a.pcie_copies);
  if (!pcie.ok()) return fail("pcie", pcie.error());

  std::vector<Pass> disks;
  std::vector<CacheRound> caches;
  Pacer pacer(a.gap_ms);
  for (uint32_t r = 0; r <= a.rounds; ++r) {
    auto d = disk_pass(a, src, used, pacer);
    if (!d.ok()) return fail("disk", d.error());
    disks.push_back(*d);
    if (r == a.rounds) break;
    auto c = cache_pass(a, src, *dev, used, pacer);
    if (!c.ok()) return fail("cache", c.error());
    if (caches.empty()) {
      const std::string w = tools::small_pages_warning(c->counters.staging_page_bytes,
                                                       c->counters.staging_huge_fraction, src.read_bytes);
      if (!w.empty()) std::fprintf(stderr, "bench-cache: warning: %s\n", w.c_str());
    }
    caches.push_back(std::move(*c));
  }

  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  std::vector<double> ratios;
  double cache_bytes = 0, cache_secs = 0, disk_bytes = 0, disk_secs = 0;
  uint64_t misses = 0, hits = 0, stall_ns = 0, requests = 0;
  std::vector<const LatencyHistogram*> read_h, h2d_h;
  for (uint32_t r = 0; r < a.rounds; ++r) {
    const CacheRound& c = caches[r];
    double disk = (disks[r].gbps() + disks[r + 1].gbps()) / 2;
    double bound = std::min(disk, *pcie);
    double ratio = bound > 0 ? c.pass.gbps() / bound : 0.0;
    ratios.push_back(ratio);
    cache_bytes += c.pass.bytes;
    cache_secs += c.pass.secs;
    misses += c.counters.cache_misses;
    hits += c.counters.cache_hits;
    stall_ns += c.counters.stall_ns;
    requests += c.requests;
    read_h.push_back(&c.counters.read_latency);
    h2d_h.push_back(&c.counters.h2d_latency);
    nlohmann::ordered_json j;
    j["round"] = r;
    j["disk_before_gbps"] = disks[r].gbps();
    j["disk_after_gbps"] = disks[r + 1].gbps();
    j["disk_gbps"] = disk;
    j["cache_miss_gbps"] = c.pass.gbps();
    j["cache_seconds"] = c.pass.secs;
    j["disk_before_idle_s"] = disks[r].idle_before_s;
    j["cache_idle_s"] = c.pass.idle_before_s;
    j["ratio_vs_min_disk_pcie"] = ratio;
    j["stall_ms_per_miss"] = double(c.counters.stall_ns) / 1e6 / double(c.counters.cache_misses);
    j["stall_ms_per_request"] = double(c.counters.stall_ns) / 1e6 / double(c.requests);
    j["read_p50_ms_upper"] = double(c.counters.read_latency.quantile_ns(0.5)) / 1e6;
    j["h2d_p50_ms_upper"] = double(c.counters.h2d_latency.quantile_ns(0.5)) / 1e6;
    rounds.push_back(std::move(j));
  }
  // Pooled disk: each disk pass weighted as often as it brackets a cache pass
  // (the first and last once, the others twice), so it matches the rounds.
  for (size_t i = 0; i < disks.size(); ++i) {
    double w = (i == 0 || i + 1 == disks.size()) ? 1 : 2;
    disk_bytes += w * disks[i].bytes;
    disk_secs += w * disks[i].secs;
  }
  double disk_pooled = disk_bytes / disk_secs / 1e9;
  double cache_pooled = cache_bytes / cache_secs / 1e9;
  double pooled_bound = std::min(disk_pooled, *pcie);
  std::vector<double> disk_rates;
  for (const Pass& d : disks) disk_rates.push_back(d.gbps());

  nlohmann::ordered_json j;
  j["device"] = dev->backend_name();
  j["object_bytes"] = a.object_bytes;
  j["objects"] = used;
  j["per_request"] = a.per_request;
  j["staging_slots"] = a.staging;
  j["staging_page_bytes"] = caches.front().counters.staging_page_bytes;
  j["staging_huge_fraction"] = caches.front().counters.staging_huge_fraction;
  j["read_splits"] = a.splits;
  j["queue_depth"] = a.queue_depth;
  j["max_bytes_in_flight"] = uint64_t(a.staging) * stride;
  j["disk_pass_same_inflight"] =
      "disk passes use the cache's staging_slots, read_splits and queue_depth";
  j["outstanding_requests"] = a.outstanding;
  j["verify"] = a.verify;
  j["round_count"] = a.rounds;
  j["disk_gbps"] = disk_pooled;
  j["disk_min_gbps"] = *std::min_element(disk_rates.begin(), disk_rates.end());
  j["disk_max_gbps"] = *std::max_element(disk_rates.begin(), disk_rates.end());
  j["disk_passes_gbps"] = disk_rates;
  j["gap_ms"] = a.gap_ms;
  j["disk_wait"] = a.disk_spin ? "spin" : "block";
  {
    std::vector<double> idle;
    for (const Pass& d : disks) idle.push_back(d.idle_before_s);
    for (const CacheRound& c : caches) idle.push_back(c.pass.idle_before_s);
    j["idle_before_pass_min_s"] = *std::min_element(idle.begin(), idle.end());
    j["idle_before_pass_max_s"] = *std::max_element(idle.begin(), idle.end());
  }
  j["pcie_gbps"] = *pcie;
  j["pcie_copies"] = a.pcie_copies;
  j["cache_miss_gbps"] = cache_pooled;
  j["rates_method"] =
      "disk_gbps and cache_miss_gbps are pooled: total bytes / total seconds over all passes "
      "(inner disk passes weighted twice, as each brackets two cache passes)";
  j["ratio_vs_min_disk_pcie"] = median(ratios);
  j["ratio_method"] =
      "median over rounds of cache_r / min((disk_before_r + disk_after_r) / 2, pcie), where "
      "disk_before_r and disk_after_r are the disk passes just before and after cache pass r";
  j["ratio_min"] = *std::min_element(ratios.begin(), ratios.end());
  j["ratio_max"] = *std::max_element(ratios.begin(), ratios.end());
  j["ratio_pooled"] = pooled_bound > 0 ? cache_pooled / pooled_bound : 0.0;
  j["cache_misses"] = misses;
  j["cache_hits"] = hits;
  j["stall_ms_per_miss"] = misses ? double(stall_ns) / 1e6 / double(misses) : 0;
  j["stall_ms_per_request"] = requests ? double(stall_ns) / 1e6 / double(requests) : 0;
  j["read_p50_ms_upper"] = merged_quantile_ms(read_h, 0.5);
  j["h2d_p50_ms_upper"] = merged_quantile_ms(h2d_h, 0.5);
  j["rounds"] = std::move(rounds);
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (auto rc = parse(argc, argv, &a)) return *rc;
  int rc = 1;
  try {
    rc = run(a);
  } catch (const std::exception& e) {  // e.g. bad_alloc: report, do not abort
    std::fprintf(stderr, "bench-cache: %s\n", e.what());
  }
  if (!a.keep) ::unlink(a.file.c_str());
  return rc;
}
