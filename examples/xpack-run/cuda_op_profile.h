// --profile-ops: where a CUDA step's time goes. Each backend operation is
// bracketed by two events on the compute stream (its GPU time) and two host
// clocks (the time the host spent enqueuing it, or waiting in download()).
// Comparing the GPU time of all operations with the wall time of a section
// says whether the step is bound by kernels or by the host feeding them.
//
// The GPU time of an operation is from the moment the stream reaches its first
// event to its last: where the GPU sat idle inside that span waiting for the
// host to enqueue the kernel, that wait is counted too, so a sum over
// operations is an upper bound on the time the GPU was busy.
//
// Recording two events per operation costs the host about as much as a launch:
// a profiled run is slower than a plain one, and the table says so.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace xrun {

class OpProfile {
 public:
  explicit OpProfile(cudaStream_t stream) : stream_(stream) {}
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Brackets one operation; a null profile makes it a no-op.
  // Nested scopes (an operation that allocates or copies on its own) count
  // toward the outermost one.
  class Scope {
   public:
    Scope(OpProfile* p, const char* name, std::string detail = {});
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfile* p_;
    std::string key_;
    cudaEvent_t begin_ = nullptr;
    std::chrono::steady_clock::time_point t0_;
  };

  // From now on the totals go to a section of this name (e.g. "prefill",
  // "decode"); the previous section's wall time ends here. Synchronises the stream.
  void section(const std::string& name);
  // The table of every section, on its first call ending the last section.
  std::string report();
  // After the stream was synchronised: folds the finished operations into the
  // totals and reuses their events.
  void collect();

 private:
  struct Totals {
    int64_t calls = 0;
    double gpu_ms = 0, host_ms = 0;
  };
  struct Pending {
    std::string key;
    cudaEvent_t begin, end;
  };
  struct Section {
    std::string name;
    std::map<std::string, Totals> ops;
    double wall_ms = 0;
  };

  cudaEvent_t take_event();
  Section& current();

  cudaStream_t stream_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<Pending> pending_;
  std::vector<Section> sections_;
  std::chrono::steady_clock::time_point section_start_ = std::chrono::steady_clock::now();
  int depth_ = 0;
  bool ended_ = false;
};

}  // namespace xrun
