// The CPU implementation of ComputeBackend: dequantizes one weight row at a
// time into a per-thread scratch buffer and dots it with every token's input.
// Each output element is produced by exactly one thread in a fixed order, so
// results do not depend on the thread count or on where the weights came from.
#pragma once

#include "ops.h"

namespace xrun {

class CpuBackend final : public ComputeBackend {
 public:
  void matmul(uint32_t type, const void* w, int64_t ne0, int64_t ne1, const float* x, int n_tokens,
              float* y) override;
  const char* name() const override { return "cpu"; }
};

// parallel_for, but run inline when the whole job is too small to pay for
// waking the workers (work = rough count of multiply-adds per item).
void parallel_for_work(int64_t n, int64_t work_per_item,
                       const std::function<void(int64_t begin, int64_t end)>& fn);

// Dot product of two float vectors, summed in a fixed order.
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace xrun
