// bench-cache: how close the cache's miss delivery (SSD -> staging -> device
// slot) comes to the slower of the two links it chains, measured in the same run:
//   disk  = io_uring O_DIRECT reads of the same objects into staging, no copies
//   pcie  = pinned host -> device copies of one object, back to back
//   cache = acquire() of never-seen experts (every request a miss), wait_all
// The disk is measured before and after the cache pass; disk_gbps is the mean.
// Prints JSON: the three rates in GB/s (decimal), ratio = cache / min(disk, pcie)
// and the mean stall per miss (time acquire callers spent blocked).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/expert_cache.h"
#include "common/checked_math.h"
#include "io/read_engine.h"

using namespace xpack;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string file = "bench-cache.bin";
  std::string device = "auto";
  uint64_t object_bytes = 13'369'344;  // DeepSeek-V4-Flash MXFP4 expert
  uint32_t objects = 384;              // ~5 GB
  uint32_t per_request = 6;            // top-k
  uint32_t staging = 12;
  uint32_t splits = 4;
  uint32_t queue_depth = 64;
  // Requests acquired before the oldest is waited for: 1 = the runtime's worst
  // case (next layer unknown until this one ran), 2+ = keeps the disk queue full.
  uint32_t outstanding = 2;
  bool keep = false;
};

void usage() {
  std::printf(
      "usage: bench-cache [--file PATH] [--device auto|cuda|host] [--object-bytes N]\n"
      "                   [--objects N] [--per-request K] [--staging N] [--splits N]\n"
      "                   [--qd N] [--outstanding N] [--keep]\n"
      "Writes PATH (objects x stride bytes of pattern) unless it exists with the right\n"
      "size, then measures disk, PCIe and cache miss delivery rates; prints JSON.\n");
}

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (k == "--help") { usage(); std::exit(0); }
    if (k == "--keep") { a->keep = true; continue; }
    if (!(v = next())) return false;
    if (k == "--file") a->file = v;
    else if (k == "--device") a->device = v;
    else if (k == "--object-bytes") a->object_bytes = std::stoull(v);
    else if (k == "--objects") a->objects = uint32_t(std::stoul(v));
    else if (k == "--per-request") a->per_request = uint32_t(std::stoul(v));
    else if (k == "--staging") a->staging = uint32_t(std::stoul(v));
    else if (k == "--splits") a->splits = uint32_t(std::stoul(v));
    else if (k == "--qd") a->queue_depth = uint32_t(std::stoul(v));
    else if (k == "--outstanding") a->outstanding = uint32_t(std::stoul(v));
    else return false;
  }
  return a->object_bytes > 0 && a->objects >= a->per_request && a->per_request > 0 &&
         a->outstanding > 0;
}

Status ensure_file(const Args& a, uint64_t stride) {
  uint64_t want = stride * a.objects;
  struct stat st{};
  if (::stat(a.file.c_str(), &st) == 0 && uint64_t(st.st_size) == want) return {};
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

Result<double> disk_rate(const Args& a, const cache::ObjectSource& src) {
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
  double t0 = now_s();
  while (finished < a.objects) {
    std::vector<io::ReadRequest> batch;
    while (!free_slots.empty() && next < a.objects) {
      uint32_t s = free_slots.back();
      free_slots.pop_back();
      batch.push_back({0, src.offset(0, next), src.read_bytes, s, next});
      ++next;
    }
    if (!batch.empty()) XPACK_TRY(eng->submit(batch));
    done.clear();
    XPACK_ASSIGN_OR_RETURN(size_t n, eng->poll(-1, &done));
    (void)n;
    for (auto& c : done) {
      if (c.status != 0) return err(c.status, "disk read failed: {}", eng->last_failure());
      free_slots.push_back(c.slot);
      ++finished;
    }
  }
  return double(a.objects) * double(src.object_bytes) / (now_s() - t0) / 1e9;
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

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) {
    usage();
    return 2;
  }
  uint64_t stride = align_up(a.object_bytes, 4096);
  if (auto st = ensure_file(a, stride); !st.ok()) {
    std::fprintf(stderr, "bench-cache: %s\n", st.error().message.c_str());
    return 1;
  }
  cache::ObjectSource src;
  src.path = a.file;
  src.n_layers = 1;
  src.n_experts = a.objects;
  src.top_k = a.per_request;
  src.object_bytes = a.object_bytes;
  src.read_bytes = stride;
  src.offset = [stride](uint32_t, uint32_t e) { return uint64_t(e) * stride; };

  std::unique_ptr<device::Device> dev;
  if (a.device != "host") {
    auto d = device::make_cuda_device(0);
    if (d.ok()) dev = std::move(*d);
    else if (a.device == "cuda") {
      std::fprintf(stderr, "bench-cache: %s\n", d.error().message.c_str());
      return 1;
    }
  }
  if (!dev) dev = device::make_host_device();

  auto disk = disk_rate(a, src);
  if (!disk.ok()) {
    std::fprintf(stderr, "bench-cache: disk: %s\n", disk.error().message.c_str());
    return 1;
  }
  auto pcie = pcie_rate(*dev, a.object_bytes, 64);
  if (!pcie.ok()) {
    std::fprintf(stderr, "bench-cache: pcie: %s\n", pcie.error().message.c_str());
    return 1;
  }

  cache::CacheOptions co;
  co.budget_bytes = uint64_t(a.per_request) * (a.outstanding + 2) * align_up(a.object_bytes, 256);
  co.staging_slots = a.staging;
  co.read_splits = a.splits;
  co.queue_depth = a.queue_depth;
  co.policy = cache::PolicyKind::kLru;
  auto c = cache::ExpertCache::create(src, *dev, co);
  if (!c.ok()) {
    std::fprintf(stderr, "bench-cache: cache: %s\n", c.error().message.c_str());
    return 1;
  }
  // Every object once, per_request at a time: all misses, never a hit. Up to
  // `outstanding` requests are in flight before the oldest is waited for.
  double t0 = now_s();
  uint32_t requests = 0;
  std::deque<cache::TicketId> inflight;
  auto finish_oldest = [&]() -> bool {
    cache::TicketId t = inflight.front();
    inflight.pop_front();
    bool ok = (*c)->wait_all(t).ok();
    return (*c)->release(t).ok() && ok;
  };
  for (uint32_t first = 0; first + a.per_request <= a.objects; first += a.per_request) {
    std::vector<uint32_t> ids(a.per_request);
    for (uint32_t i = 0; i < a.per_request; ++i) ids[i] = first + i;
    auto got = (*c)->acquire(0, ids.data(), ids.size());
    if (!got.ok()) {
      std::fprintf(stderr, "bench-cache: acquire: %s\n", got.error().message.c_str());
      return 1;
    }
    inflight.push_back(got->ticket);
    ++requests;
    if (inflight.size() >= a.outstanding && !finish_oldest()) {
      std::fprintf(stderr, "bench-cache: a load failed\n");
      return 1;
    }
  }
  while (!inflight.empty())
    if (!finish_oldest()) {
      std::fprintf(stderr, "bench-cache: a load failed\n");
      return 1;
    }
  double secs = now_s() - t0;
  // The disk drifts between runs (virtio): measure it again after the cache pass
  // and compare against the mean of both measurements.
  auto disk_after = disk_rate(a, src);
  if (!disk_after.ok()) {
    std::fprintf(stderr, "bench-cache: disk: %s\n", disk_after.error().message.c_str());
    return 1;
  }
  double disk_mean = (*disk + *disk_after) / 2;
  auto s = (*c)->counters();
  double delivered = double(s.h2d_bytes) / secs / 1e9;
  double bound = std::min(disk_mean, *pcie);
  nlohmann::ordered_json j;
  j["device"] = dev->backend_name();
  j["object_bytes"] = a.object_bytes;
  j["objects"] = a.objects;
  j["per_request"] = a.per_request;
  j["staging_slots"] = a.staging;
  j["read_splits"] = a.splits;
  j["outstanding_requests"] = a.outstanding;
  j["disk_gbps"] = disk_mean;
  j["disk_before_gbps"] = *disk;
  j["disk_after_gbps"] = *disk_after;
  j["pcie_gbps"] = *pcie;
  j["cache_miss_gbps"] = delivered;
  j["ratio_vs_min_disk_pcie"] = bound > 0 ? delivered / bound : 0.0;
  j["cache_misses"] = s.cache_misses;
  j["cache_hits"] = s.cache_hits;
  j["stall_ms_per_miss"] = s.cache_misses ? double(s.stall_ns) / 1e6 / double(s.cache_misses) : 0;
  j["stall_ms_per_request"] = requests ? double(s.stall_ns) / 1e6 / requests : 0;
  j["read_p50_ms_upper"] = double(s.read_latency.quantile_upper_ns(0.5)) / 1e6;
  j["h2d_p50_ms_upper"] = double(s.h2d_latency.quantile_upper_ns(0.5)) / 1e6;
  std::printf("%s\n", j.dump(2).c_str());
  c->reset();
  if (!a.keep) ::unlink(a.file.c_str());
  return 0;
}
