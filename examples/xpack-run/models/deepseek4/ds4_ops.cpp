#include "ds4_ops.h"

#include <string>

#include "../../cpu_backend.h"
#include "ds4_ops_cpu.h"

namespace xrun::ds4 {

#ifdef XRUN_HAVE_CUDA
// ds4_ops_cuda.cpp, built with the CUDA backend: nullptr unless `be` is it.
std::unique_ptr<Ds4Ops> make_cuda_ds4_ops(Backend& be);
#endif

std::unique_ptr<Ds4Ops> make_ds4_ops(Backend& be) {
  if (auto* cpu = dynamic_cast<CpuBackend*>(&be)) return std::make_unique<CpuDs4Ops>(cpu->pool());
#ifdef XRUN_HAVE_CUDA
  if (auto ops = make_cuda_ds4_ops(be)) return ops;
#endif
  throw ModelError(std::string("deepseek4: no kernels for the ") + be.name() + " backend yet");
}

}  // namespace xrun::ds4
