#include "kimi_ops.h"

#include <string>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

std::unique_ptr<KimiOps> make_kimi_ops(Backend& be) {
  if (auto* cpu = dynamic_cast<CpuBackend*>(&be)) return std::make_unique<CpuKimiOps>(cpu->pool());
  throw ModelError(std::string("kimi-k3: no kernels for the ") + be.name() + " backend yet");
}

}  // namespace xrun::kimi_k3
