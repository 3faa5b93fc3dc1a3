#include "experts.h"

namespace xrun {

const Tensor* ExpertWeights::role(const char* name) const {
  for (const auto& [n, m] : roles) {
    if (n == name) return &m;
  }
  return nullptr;
}

}  // namespace xrun
