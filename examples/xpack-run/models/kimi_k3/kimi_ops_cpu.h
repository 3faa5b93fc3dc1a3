// kimi-k3's own operations on the CPU backend (see kimi_ops.h).
#pragma once

#include "../../worker_pool.h"
#include "kimi_ops.h"

namespace xrun::kimi_k3 {

class CpuKimiOps final : public KimiOps {
 public:
  explicit CpuKimiOps(WorkerPool& pool) : pool_(pool) {}
  void situ(const Tensor& g, const Tensor& u, float beta, float linear_beta) override;
  void res_mix(const Tensor& cur, const std::vector<Tensor>& ckpts, const Tensor& score_w, float eps,
               const Tensor& out) override;
  void short_conv_silu(const Tensor& x, const Tensor& weight, const Tensor& state) override;
  void kda_gate(const Tensor& g, const Tensor& dt_bias, const Tensor& a, int64_t head_dim, bool has_lower_bound,
                float lower_bound) override;
  void delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& state, const Tensor& o) override;
  void delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          const Tensor& state, const Tensor& o, int64_t chunk) override;
  // 16: the pairwise factors cost chunk/2 exps per token and key channel, the
  // rest is the recurrence's work (see kda_cpu.cpp)
  int64_t delta_rule_chunk(int64_t) const override { return 16; }
  void mla_attention(const Tensor& q, const Tensor& latent, const Tensor& rope_key, const Tensor& k_b,
                     const Tensor& v_b, int64_t n_head, int64_t pos0, float scale, const Tensor& o) override;

 private:
  WorkerPool& pool_;  // the CPU backend's
};

}  // namespace xrun::kimi_k3
