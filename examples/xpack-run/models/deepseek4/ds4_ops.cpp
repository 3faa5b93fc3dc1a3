#include "ds4_ops.h"

#include <string>

#include "ds4_ops_cpu.h"

namespace xrun::ds4 {

std::unique_ptr<Ds4Ops> make_ds4_ops(Backend& be) {
  if (std::string(be.name()) == "cpu") return std::make_unique<CpuDs4Ops>();
  throw ModelError(std::string("deepseek4: no kernels for the ") + be.name() + " backend yet");
}

}  // namespace xrun::ds4
