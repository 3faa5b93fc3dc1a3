// The read paths xpack-fio compares. Each runs one mode against one workload and
// measures bytes, I/O count, wall time, CPU time and per-read latency.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/latency_histogram.h"

namespace xpack::device {
class Device;
}

namespace xpack::bench {

// Which block the i-th read of a run reads: a pure function of i, so threads can
// share one atomic counter and the uring runner the same sequence.
struct Workload {
  std::string path;
  uint64_t bs = 0;               // bytes per read (aligned)
  uint64_t payload = 0;          // bytes counted per read (pack objects: the payload)
  uint64_t nblocks = 0;          // file mode: blocks of bs in the file
  bool random = true;
  std::vector<uint64_t> offsets; // pack mode: routing-like object order, cycled
  uint64_t offset(uint64_t i) const;
};

struct RunLimits {
  double runtime_s = 0;  // 0 = no time limit
  uint64_t ios = 0;      // 0 = no count limit
};

struct RunResult {
  std::string mode;
  uint64_t ios = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  LatencyHistogram latency;
  std::string ring_flags;  // uring modes
  uint64_t h2d_bytes = 0;
  // The staging memory's backing (io::StagingArena): page size of most of it,
  // fraction in huge pages, a line for humans, and whether huge pages were wanted.
  uint64_t page_bytes = 0;
  double huge_fraction = 0;
  std::string pages;
  bool huge_wanted = false;
};

// huge_pages = false forces 4 KiB staging pages (to measure what huge pages bring).
Result<RunResult> run_threaded(const Workload& w, const RunLimits& lim, uint32_t threads,
                               bool direct, bool huge_pages = true);
// fixed: registered buffers + files; sqpoll implies fixed.
Result<RunResult> run_uring(const Workload& w, const RunLimits& lim, uint32_t qd, bool fixed,
                            bool sqpoll, uint32_t splits, device::Device* h2d,
                            bool huge_pages = true);

}  // namespace xpack::bench
