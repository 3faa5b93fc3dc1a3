// xpack-fio: SSD -> pinned memory read benchmark comparing the traditional
// buffered path, the seed's O_DIRECT thread pool and libxpack's io_uring paths.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_app.h"
#include "device/device.h"
#include "fio_options.h"
#include "fio_runners.h"
#include "io/alignment.h"
#include "io/pack_reads.h"
#include "pack/pack_reader.h"

using namespace xpack;
using namespace xpack::bench;

namespace {

// Creates `path` with `size` bytes of pseudo-random data (incompressible, so no
// filesystem or device shortcut), syncing it to the device.
Status create_random_file(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("create {}", path);
  std::vector<uint64_t> chunk((4u << 20) / 8);
  std::mt19937_64 rng(0x5eed);
  uint64_t written = 0;
  while (written < size) {
    for (auto& x : chunk) x = rng();
    uint64_t n = std::min<uint64_t>(size - written, chunk.size() * 8);
    const char* p = reinterpret_cast<const char*>(chunk.data());
    uint64_t off = 0;
    while (off < n) {
      ssize_t w = ::write(fd, p + off, n - off);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        Error e = errno_error("write {}", path);
        close(fd);
        unlink(path.c_str());
        return e;
      }
      off += uint64_t(w);
    }
    written += n;
  }
  if (fsync(fd) != 0) {
    Error e = errno_error("fsync {}", path);
    close(fd);
    return e;
  }
  close(fd);
  return {};
}

// Drops the page cache so a buffered mode reads the device, not memory.
void drop_page_cache() {
  // The test suite sets this: dropping the cache of a shared machine slows everyone.
  const char* keep = getenv("XPACK_FIO_KEEP_CACHE");
  if (keep && *keep && std::strcmp(keep, "0") != 0) {
    std::fprintf(stderr, "xpack-fio: XPACK_FIO_KEEP_CACHE set: page cache not dropped\n");
    return;
  }
  if (geteuid() != 0) {
    std::fprintf(stderr,
                 "xpack-fio: not root: could not drop the page cache (buffered results may come "
                 "from memory)\n");
    return;
  }
  sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || ::write(fd, "3\n", 2) != 2) {
    std::fprintf(stderr, "xpack-fio: could not drop the page cache: %s\n", strerror(errno));
  }
  if (fd >= 0) close(fd);
}

Result<Workload> file_workload(const FioOptions& o) {
  struct stat st{};
  if (stat(o.file.c_str(), &st) != 0) {
    if (errno != ENOENT) return errno_error("stat {}", o.file);
    std::fprintf(stderr, "xpack-fio: creating %s with %llu bytes of random data\n", o.file.c_str(),
                 static_cast<unsigned long long>(o.size));
    XPACK_TRY(create_random_file(o.file, o.size));
    if (stat(o.file.c_str(), &st) != 0) return errno_error("stat {}", o.file);
  }
  Workload w;
  w.path = o.file;
  w.bs = o.bs;
  w.payload = o.bs;
  w.random = o.random;
  // As fio's --size: an existing file is read within its first SIZE bytes.
  const uint64_t extent = o.size_given ? std::min<uint64_t>(uint64_t(st.st_size), o.size) : uint64_t(st.st_size);
  w.nblocks = extent / o.bs;
  if (w.nblocks == 0)
    return err(XPACK_E_INVALID_ARG, "{} ({} bytes{}) is smaller than one block of {} bytes", o.file,
               uint64_t(st.st_size), o.size_given ? fmt::format(", --size {}", o.size) : std::string(), o.bs);
  return w;
}

// Routing-like order: token after token, every MoE layer picks top-k distinct
// experts at random; consecutive reads therefore jump across the whole pack.
Result<Workload> pack_workload(const FioOptions& o) {
  XPACK_ASSIGN_OR_RETURN(auto reader, pack::PackReader::open(o.pack));
  auto g = io::geometry_of(reader);
  XPACK_TRY(io::check_geometry(g));
  Workload w;
  w.path = g.path;
  w.bs = io::object_read_length(g);
  w.payload = g.object_bytes;
  uint32_t k = reader.n_experts_used() ? reader.n_experts_used() : std::min(8u, g.n_experts);
  k = std::min(k, g.n_experts);
  std::mt19937_64 rng(42);
  std::vector<uint32_t> experts(g.n_experts);
  const size_t target = 1u << 16;
  while (w.offsets.size() < target) {
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (uint32_t e = 0; e < g.n_experts; ++e) experts[e] = e;
      for (uint32_t j = 0; j < k; ++j) {
        std::uniform_int_distribution<uint32_t> pick(j, g.n_experts - 1);
        std::swap(experts[j], experts[pick(rng)]);
        auto req = io::object_read(g, l, experts[j], 0);
        w.offsets.push_back(req->offset);
      }
    }
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  FioOptions o;
  if (auto rc = parse_fio_args(argc, argv, &o)) return *rc;

  std::unique_ptr<device::Device> gpu;
  if (o.h2d) {
    auto d = device::make_cuda_device(0);
    if (!d.ok()) {
      std::fprintf(stderr,
                   "xpack-fio: --h2d needs libxpack built with CUDA and a usable GPU "
                   "(meson setup -Dcuda=enabled): %s\n",
                   d.error().message.c_str());
      return 2;
    }
    gpu = std::move(d).value();
  }

  auto workload = o.pack.empty() ? file_workload(o) : pack_workload(o);
  if (!workload.ok()) {
    std::fprintf(stderr, "xpack-fio: %s\n", workload.error().message.c_str());
    return 1;
  }
  const Workload& w = *workload;
  RunLimits lim{o.runtime_s, o.ios};

  if (!o.json) {
    std::printf("file %s  bs %s  qd %u  pattern %s%s%s  %s\n", w.path.c_str(), cli::size_text(w.bs).c_str(),
                o.qd, o.pack.empty() ? (o.random ? "rand" : "seq") : "pack-routing",
                o.h2d ? "  +h2d" : "", o.small_pages ? "  4K pages forced" : "",
                o.ios ? fmt::format("{} ios", o.ios).c_str()
                      : fmt::format("{} s", o.runtime_s).c_str());
    std::printf("%-13s %9s %10s %10s %10s %10s %10s %10s  %s\n", "mode", "GB/s", "IOPS", "p50 us",
                "p99 us", "p99.9 us", "CPU s/GB", "pages", "ring");
  }
  int rc = 0;
  for (const auto& mode : o.modes) {
    drop_page_cache();
    Result<RunResult> r = err(XPACK_E_INTERNAL, "mode not run");
    if (o.h2d && (mode == "buffered" || mode == "pread-direct")) {
      std::fprintf(stderr, "xpack-fio: --h2d applies to the uring modes only; %s runs without it\n",
                   mode.c_str());
    }
    if (mode == "buffered") r = run_threaded(w, lim, o.qd, false, !o.small_pages);
    else if (mode == "pread-direct") r = run_threaded(w, lim, o.qd, true, !o.small_pages);
    else if (mode == "uring") r = run_uring(w, lim, o.qd, false, false, o.splits, gpu.get(), !o.small_pages);
    else if (mode == "uring-fixed") r = run_uring(w, lim, o.qd, true, false, o.splits, gpu.get(), !o.small_pages);
    else if (mode == "uring-sqpoll") r = run_uring(w, lim, o.qd, true, true, o.splits, gpu.get(), !o.small_pages);
    if (!r.ok()) {
      std::fprintf(stderr, "xpack-fio: %s: %s\n", mode.c_str(), r.error().message.c_str());
      rc = 1;
      continue;
    }
    const RunResult& x = *r;
    if (x.huge_wanted && x.huge_fraction < 1.0)
      std::fprintf(stderr,
                   "xpack-fio: warning: %s: staging memory in %s; 1 MiB+ reads into 4 KiB pages "
                   "exceed NVMe max_segments and are split (set THP to madvise/always or reserve "
                   "hugetlb pages: vm.nr_hugepages)\n",
                   mode.c_str(), x.pages.c_str());
    std::string pages_col = x.page_bytes == 0 ? "?"
                            : x.page_bytes >= (1ull << 20)
                                ? fmt::format("{}M {:.0f}%", x.page_bytes >> 20, x.huge_fraction * 100)
                                : fmt::format("{}K {:.0f}%", x.page_bytes >> 10, x.huge_fraction * 100);
    double gb = double(x.bytes) / 1e9;
    double gbps = x.seconds > 0 ? gb / x.seconds : 0;
    double iops = x.seconds > 0 ? double(x.ios) / x.seconds : 0;
    double cpu_per_gb = gb > 0 ? x.cpu_seconds / gb : 0;
    double p50 = double(x.latency.quantile_ns(0.5)) / 1e3;
    double p99 = double(x.latency.quantile_ns(0.99)) / 1e3;
    double p999 = double(x.latency.quantile_ns(0.999)) / 1e3;
    if (o.json) {
      nlohmann::json j = {{"mode", mode},
                          {"file", w.path},
                          {"bs", w.bs},
                          {"qd", o.qd},
                          {"pattern", o.pack.empty() ? (o.random ? "rand" : "seq") : "pack"},
                          {"splits", o.splits},
                          {"read_gbps", gbps},
                          {"iops", iops},
                          {"lat_p50_us", p50},
                          {"lat_p99_us", p99},
                          {"lat_p999_us", p999},
                          {"cpu_s_per_gb", cpu_per_gb},
                          {"bytes", x.bytes},
                          {"ios", x.ios},
                          {"seconds", x.seconds},
                          {"cpu_seconds", x.cpu_seconds},
                          {"h2d_bytes", x.h2d_bytes},
                          {"ring_flags", x.ring_flags},
                          {"staging_page_bytes", x.page_bytes},
                          {"staging_huge_fraction", x.huge_fraction},
                          {"staging_pages", x.pages},
                          {"small_pages_forced", o.small_pages}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-13s %9.3f %10.0f %10.1f %10.1f %10.1f %10.3f %10s  %s\n", mode.c_str(), gbps,
                  iops, p50, p99, p999, cpu_per_gb, pages_col.c_str(), x.ring_flags.c_str());
    }
    std::fflush(stdout);
  }
  return rc;
}
