// The situ activation on the CPU.
#include <cmath>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

void CpuKimiOps::situ(const Tensor& g, const Tensor& u, float beta, float linear_beta) {
  check_shape(g.numel() == u.numel(), "situ shapes disagree");
  float* gv = g.f32();
  const float* uv = u.f32();
  for (int64_t i = 0; i < g.numel(); ++i) {
    const float a = std::tanh(gv[i] * (1.0f / beta)) * beta * sigmoid(gv[i]);
    const float b = linear_beta > 0.0f ? std::tanh(uv[i] * (1.0f / linear_beta)) * linear_beta : uv[i];
    gv[i] = a * b;
  }
}

}  // namespace xrun::kimi_k3
