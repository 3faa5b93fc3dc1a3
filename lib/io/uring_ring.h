// One io_uring instance set up with deliberately chosen flags, probed at run
// time (a flag in the headers may be unknown to the running kernel: -EINVAL).
//
// Preference order without SQPOLL:
//   SINGLE_ISSUER | DEFER_TASKRUN  (6.1+: completion work runs only when we reap,
//                                   in our thread, no IPIs; we reap regularly)
//   SINGLE_ISSUER | COOP_TASKRUN   (6.0+)
//   COOP_TASKRUN                   (5.19+)
//   no flags
// With SQPOLL: SQPOLL | SINGLE_ISSUER, then SQPOLL alone.
// Every ring starts R_DISABLED when the kernel allows it, so buffers and files
// can be registered by the creating thread while the thread that first submits
// becomes the single issuer (enable()).
#pragma once
#include <liburing.h>
#include <string>

#include "common/result.h"

namespace xpack::io {

struct RingOptions {
  unsigned entries = 64;
  bool sqpoll = false;
  unsigned sqpoll_idle_ms = 1000;
  int inject_setup_errno = 0;  // test hook: pretend the kernel refused with this errno
};

class Ring {
 public:
  static Result<std::unique_ptr<Ring>> create(const RingOptions& opts);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  io_uring* get() { return &ring_; }
  unsigned flags() const { return flags_; }
  bool defer_taskrun() const { return flags_ & IORING_SETUP_DEFER_TASKRUN; }
  // Enables a ring created R_DISABLED; the calling thread becomes the issuer.
  Status enable();
  bool enabled() const { return enabled_; }
  // "SINGLE_ISSUER|DEFER_TASKRUN" etc.
  std::string describe() const;

 private:
  Ring() = default;
  io_uring ring_{};
  unsigned flags_ = 0;
  bool enabled_ = false;
};

std::string ring_flags_text(unsigned flags);

}  // namespace xpack::io
