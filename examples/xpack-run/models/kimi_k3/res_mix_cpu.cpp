// Cross-layer residual attention's mix on the CPU.
#include <cmath>
#include <vector>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

void CpuKimiOps::res_mix(const Tensor& cur, const std::vector<Tensor>& ckpts, const Tensor& score_w, float eps,
                         const Tensor& out) {
  const int64_t E = cur.width(), n = cur.rows();
  check_shape(out.width() == E && out.rows() == n && score_w.numel() == E, "res_mix shapes disagree");
  for (const Tensor& c : ckpts) check_shape(c.width() == E && c.rows() == n, "res_mix checkpoint shapes disagree");
  const size_t nc = ckpts.size();
  std::vector<float> p(nc + 1);
  auto score = [&](const float* row) {
    const float s = rms_scale(row, E, eps);
    double dot = 0.0;
    for (int64_t i = 0; i < E; ++i) dot += static_cast<double>((row[i] * s) * score_w.f32()[i]);
    return static_cast<float>(dot);
  };
  for (int64_t t = 0; t < n; ++t) {
    for (size_t c = 0; c < nc; ++c) p[c] = score(ckpts[c].f32() + t * E);
    p[nc] = score(cur.f32() + t * E);
    softmax_row(p.data(), static_cast<int64_t>(nc + 1));
    for (int64_t i = 0; i < E; ++i) {
      float acc = 0.0f;
      for (size_t c = 0; c < nc; ++c) acc += ckpts[c].f32()[t * E + i] * p[c];
      out.f32()[t * E + i] = acc + cur.f32()[t * E + i] * p[nc];
    }
  }
}

}  // namespace xrun::kimi_k3
