#include "io/memlock.h"

#include <cstdio>
#include <cstring>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace xpack::io {

MemlockAction plan_memlock(uint64_t needed, rlim_t soft, rlim_t hard, bool has_ipc_lock) {
  if (has_ipc_lock || soft == RLIM_INFINITY || soft >= needed) return MemlockAction::kNothing;
  if (hard == RLIM_INFINITY || hard >= needed) return MemlockAction::kRaiseSoft;
  return MemlockAction::kInsufficient;
}

static std::string limit_text(rlim_t v) {
  return v == RLIM_INFINITY ? std::string("unlimited") : fmt::format("{} bytes", v);
}

std::string memlock_advice(uint64_t needed, rlim_t soft, rlim_t hard) {
  return fmt::format(
      "registering {} bytes of staging buffers with io_uring needs RLIMIT_MEMLOCK >= {} "
      "bytes (now soft {}, hard {}); raise it with `ulimit -l unlimited` (or `ulimit -l {}` "
      "in KiB), LimitMEMLOCK=infinity in a systemd unit, `--ulimit memlock=-1` for docker, "
      "or run with CAP_IPC_LOCK; or use fewer/smaller staging slots",
      needed, needed, limit_text(soft), limit_text(hard), (needed + 1023) / 1024);
}

bool has_ipc_lock_capability() {
  __user_cap_header_struct hdr{};
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  hdr.pid = 0;
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

Status ensure_memlock(uint64_t needed) {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return errno_error("getrlimit(RLIMIT_MEMLOCK)");
  switch (plan_memlock(needed, lim.rlim_cur, lim.rlim_max, has_ipc_lock_capability())) {
    case MemlockAction::kNothing:
      return {};
    case MemlockAction::kRaiseSoft: {
      rlimit raised = lim;
      raised.rlim_cur = lim.rlim_max;
      if (setrlimit(RLIMIT_MEMLOCK, &raised) != 0)
        return err(XPACK_E_LIMIT, "setrlimit(RLIMIT_MEMLOCK) failed ({}); {}", strerror(errno),
                   memlock_advice(needed, lim.rlim_cur, lim.rlim_max));
      return {};
    }
    case MemlockAction::kInsufficient:
      return err(XPACK_E_LIMIT, "{}", memlock_advice(needed, lim.rlim_cur, lim.rlim_max));
  }
  return {};
}

}  // namespace xpack::io
