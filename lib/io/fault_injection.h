// Test hook: a plan of faults the engine applies to itself, so tests can exercise
// paths the hardware rarely takes (io_uring refused by the kernel, a filesystem
// without O_DIRECT, EIO, EAGAIN, short reads) without device-mapper or root.
// Compiled into the library on purpose: it costs one pointer test per completion
// when unused, and it lets the C API tests drive the same paths.
#pragma once
#include <cstdint>
#include <vector>

namespace xpack::io {

struct CompletionFault {
  uint64_t tag = 0;      // object tag (ReadRequest::tag) the fault applies to
  int32_t split = -1;    // split index inside the object, -1 = any split
  int res_errno = 0;     // if non-zero the completion's result becomes -res_errno
  uint64_t short_by = 0; // else, the completion reports this many bytes fewer
  uint32_t times = 1;    // how many completions to alter
};

struct FaultPlan {
  int ring_setup_errno = 0;    // io_uring_queue_init "fails" with -errno (ENOSYS, EPERM)
  int open_direct_errno = 0;   // open(O_DIRECT) "fails" with errno (EINVAL as on tmpfs)
  std::vector<CompletionFault> completions;
};

// Process-wide plan used by engines created without an explicit one (the C API
// has no fault field). Tests only; not thread-safe with engine creation.
void set_default_fault_plan(const FaultPlan* plan);
const FaultPlan* default_fault_plan();

// Mutable copy held by one engine: consumes `times` as faults fire.
class FaultState {
 public:
  explicit FaultState(const FaultPlan& plan) : plan_(plan) {}
  int ring_setup_errno() const { return plan_.ring_setup_errno; }
  int open_direct_errno() const { return plan_.open_direct_errno; }
  // Alters a completion result of (tag, split) per the plan; returns the new res.
  int apply(uint64_t tag, uint32_t split, int res);

 private:
  FaultPlan plan_;
};

}  // namespace xpack::io
