#include "experts.h"

namespace xrun {

const ExpertMatrix* ExpertWeights::role(const char* name) const {
  for (const auto& [n, m] : roles) {
    if (n == name) return &m;
  }
  return nullptr;
}

void ExpertSource::for_each(int layer, const int32_t* experts, int n, const ExpertFn& fn) {
  if (n <= 0) return;
  std::unique_ptr<ExpertRequest> req = acquire(layer, experts, n, nullptr);
  for (int i = 0; i < n; ++i) {
    fn(*req->get(i).weights);
    req->release(i);
  }
}

}  // namespace xrun
