#include "ds4_ops.h"

#include <string>

#include "../../cpu_backend.h"
#include "ds4_ops_cpu.h"

namespace xrun::ds4 {

std::unique_ptr<Ds4Ops> make_ds4_ops(Backend& be) {
  if (auto* cpu = dynamic_cast<CpuBackend*>(&be)) return std::make_unique<CpuDs4Ops>(cpu->pool());
  throw ModelError(std::string("deepseek4: no kernels for the ") + be.name() + " backend yet");
}

}  // namespace xrun::ds4
