// deepseek4's own operations on the CPU backend (see ds4_ops.h).
#pragma once

#include "../../worker_pool.h"
#include "ds4_ops.h"

namespace xrun::ds4 {

class CpuDs4Ops final : public Ds4Ops {
 public:
  explicit CpuDs4Ops(WorkerPool& pool) : pool_(pool) {}
  void hc_pre(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale, const Tensor& stream,
              const Tensor& input, const Tensor& post, const Tensor& comb, const Tensor* norm = nullptr) override;
  void hc_post(const HcShape& s, const Tensor& output, const Tensor& residual, const Tensor& post, const Tensor& comb,
               const Tensor& stream) override;
  void hc_head(const HcShape& s, const Tensor& mixes, const Tensor& base, const Tensor& scale, const Tensor& stream,
               const Tensor& out, const Tensor* norm = nullptr) override;
  void compress_pool(const Tensor& kv, const Tensor& score, int64_t rows_first, int64_t first_block, int64_t ratio,
                     bool overlap, const Tensor& out) override;
  void indexer_select(const Tensor& q, const Tensor& w, const Tensor& keys, int64_t n_head, int64_t pos0,
                      int64_t ratio, const Tensor& chosen) override;
  void attention(const Tensor& q, const Tensor& raw, int64_t raw_first, int64_t window, const Tensor* blocks,
                 int64_t ratio, const Tensor* chosen, const Tensor& sinks, int64_t pos0, const Tensor& out) override;

 private:
  WorkerPool& pool_;  // the CPU backend's
};

}  // namespace xrun::ds4
