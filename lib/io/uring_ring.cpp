#include "io/uring_ring.h"

#include <cstring>
#include <memory>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace xpack::io {

std::string ring_flags_text(unsigned flags) {
  struct Name { unsigned bit; const char* name; };
  static const Name names[] = {
      {IORING_SETUP_SQPOLL, "SQPOLL"},           {IORING_SETUP_SINGLE_ISSUER, "SINGLE_ISSUER"},
      {IORING_SETUP_DEFER_TASKRUN, "DEFER_TASKRUN"}, {IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"},
      {IORING_SETUP_R_DISABLED, "R_DISABLED"},   {IORING_SETUP_CQSIZE, "CQSIZE"}};
  std::string out;
  for (const auto& n : names) {
    if (flags & n.bit) {
      if (!out.empty()) out += '|';
      out += n.name;
    }
  }
  return out.empty() ? "none" : out;
}

static Error refused(int e) {
  return err(XPACK_E_URING,
             "io_uring_queue_init failed: {} (errno {}); the kernel refuses io_uring here: check "
             "sysctl kernel.io_uring_disabled (must be 0, or 1 with the io_uring group), a "
             "seccomp profile blocking io_uring_setup (docker/podman default profiles do), or "
             "a kernel without CONFIG_IO_URING",
             strerror(e), e);
}

Result<std::unique_ptr<Ring>> Ring::create(const RingOptions& opts) {
  if (opts.entries == 0 || opts.entries > 32768)
    return err(XPACK_E_INVALID_ARG, "io_uring queue depth {} out of range 1..32768", opts.entries);
  if (opts.inject_setup_errno != 0) return refused(opts.inject_setup_errno);

  std::vector<unsigned> attempts;
  if (opts.sqpoll) {
    attempts = {IORING_SETUP_SQPOLL | IORING_SETUP_SINGLE_ISSUER, IORING_SETUP_SQPOLL};
  } else {
    attempts = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
                IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN,
                IORING_SETUP_COOP_TASKRUN, 0};
  }
  std::unique_ptr<Ring> r(new Ring());
  int last = 0;
  for (bool disabled : {true, false}) {
    for (unsigned f : attempts) {
      io_uring_params p{};
      p.flags = f | IORING_SETUP_CQSIZE | (disabled ? IORING_SETUP_R_DISABLED : 0u);
      // Room for every in-flight read plus retries without CQ overflow.
      p.cq_entries = opts.entries * 2;
      if (opts.sqpoll) p.sq_thread_idle = opts.sqpoll_idle_ms;
      int ret = io_uring_queue_init_params(opts.entries, &r->ring_, &p);
      if (ret == 0) {
        r->flags_ = p.flags;
        r->enabled_ = !disabled;
        return r;
      }
      last = -ret;
      if (ret == -ENOSYS || ret == -EPERM || ret == -EACCES) return refused(-ret);
      if (ret != -EINVAL) break;  // ENOMEM etc: no flag combination will help
    }
    if (last != EINVAL) break;
  }
  if (last == ENOMEM)
    return err(-ENOMEM,
               "io_uring_queue_init: out of memory for a ring of {} entries (locked memory "
               "limit? try `ulimit -l unlimited`)",
               opts.entries);
  return err(last ? -last : XPACK_E_URING, "io_uring_queue_init failed: {} (errno {})",
             strerror(last), last);
}

Ring::~Ring() { io_uring_queue_exit(&ring_); }

Status Ring::enable() {
  if (enabled_) return {};
  // liburing 2.3 declares io_uring_enable_rings but does not export it, so the
  // register opcode is issued directly.
  long ret = syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS,
                     nullptr, 0);
  if (ret < 0) return errno_error("io_uring_register(ENABLE_RINGS)");
  enabled_ = true;
  return {};
}

std::string Ring::describe() const { return ring_flags_text(flags_ & ~IORING_SETUP_R_DISABLED); }

}  // namespace xpack::io
