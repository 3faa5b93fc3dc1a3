// RLIMIT_MEMLOCK handling for registered staging buffers. io_uring charges
// registered buffers to the locked-memory limit (unless the process has
// CAP_IPC_LOCK); the default soft limit (often 8 MiB) is far below one staging
// arena, so we raise the soft limit up to the hard limit when that is enough and
// otherwise say exactly what to set.
#pragma once
#include <cstdint>
#include <sys/resource.h>

#include "common/result.h"

namespace xpack::io {

enum class MemlockAction { kNothing, kRaiseSoft, kInsufficient };

// Pure decision (testable without privileges): what to do for `needed` bytes
// given the current limits and whether the process is exempt (CAP_IPC_LOCK).
MemlockAction plan_memlock(uint64_t needed, rlim_t soft, rlim_t hard, bool has_ipc_lock);

// The message for kInsufficient (and for ENOMEM from registration).
std::string memlock_advice(uint64_t needed, rlim_t soft, rlim_t hard);

// Applies the plan for this process: raises the soft limit when that suffices;
// returns XPACK_E_LIMIT with memlock_advice when it cannot.
Status ensure_memlock(uint64_t needed);

// True when the calling process has CAP_IPC_LOCK in its effective set.
bool has_ipc_lock_capability();

}  // namespace xpack::io
