#include "experts.h"

#include <string>

#include <nlohmann/json.hpp>

#include "weights.h"

namespace xrun {

nlohmann::ordered_json ExpertSource::counters_json() const { return nlohmann::ordered_json::object(); }

void ExpertSource::prefetch(int layer, const int32_t* experts, int n) {
  if (!has_layer(layer)) throw ModelError("prefetch: no routed experts in layer " + std::to_string(layer));
  for (int i = 0; i < n; ++i) {
    if (experts[i] < 0 || experts[i] >= n_experts()) {
      throw ModelError("prefetch: expert id " + std::to_string(experts[i]) + " out of range");
    }
  }
}

const Tensor* ExpertWeights::role(const char* name) const {
  for (const auto& [n, m] : roles) {
    if (n == name) return &m;
  }
  return nullptr;
}

}  // namespace xrun
