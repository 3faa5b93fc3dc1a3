#include "kimi_ops.h"

#include <string>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

#ifdef XRUN_HAVE_CUDA
// kimi_ops_cuda.cpp, built with the CUDA backend: nullptr unless `be` is it.
std::unique_ptr<KimiOps> make_cuda_kimi_ops(Backend& be);
#endif

std::unique_ptr<KimiOps> make_kimi_ops(Backend& be) {
  if (auto* cpu = dynamic_cast<CpuBackend*>(&be)) return std::make_unique<CpuKimiOps>(cpu->pool());
#ifdef XRUN_HAVE_CUDA
  if (auto ops = make_cuda_kimi_ops(be)) return ops;
#endif
  throw ModelError(std::string("kimi-k3: no kernels for the ") + be.name() + " backend yet");
}

}  // namespace xrun::kimi_k3
