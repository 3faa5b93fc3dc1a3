#include "io/fault_injection.h"

#include <atomic>

namespace xpack::io {

static std::atomic<const FaultPlan*> g_default_plan{nullptr};

void set_default_fault_plan(const FaultPlan* plan) { g_default_plan.store(plan); }
const FaultPlan* default_fault_plan() { return g_default_plan.load(); }

int FaultState::apply(uint64_t tag, uint32_t split, int res) {
  for (auto& f : plan_.completions) {
    if (f.times == 0 || f.tag != tag) continue;
    if (f.split >= 0 && static_cast<uint32_t>(f.split) != split) continue;
    if (f.res_errno != 0) {
      --f.times;
      return -f.res_errno;
    }
    if (f.short_by > 0 && res > 0 && static_cast<uint64_t>(res) > f.short_by) {
      --f.times;
      return res - static_cast<int>(f.short_by);
    }
  }
  return res;
}

}  // namespace xpack::io
