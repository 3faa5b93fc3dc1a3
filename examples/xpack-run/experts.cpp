#include "experts.h"

#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "weights.h"

namespace xrun {

nlohmann::ordered_json ExpertSource::counters_json() const { return nlohmann::ordered_json::object(); }

int64_t preload_experts(ExpertSource& source, int n_blocks) {
  std::vector<int32_t> ids(static_cast<size_t>(source.n_experts()));
  std::iota(ids.begin(), ids.end(), 0);
  int64_t n = 0;
  for (int layer = 0; layer < n_blocks; ++layer) {
    if (!source.has_layer(layer)) continue;
    std::unique_ptr<ExpertRequest> req = source.acquire(layer, ids.data(), static_cast<int>(ids.size()), nullptr);
    for (int i = 0; i < static_cast<int>(ids.size()); ++i) {
      req->get(i);
      req->release(i);
      ++n;
    }
  }
  const nlohmann::ordered_json c = source.counters_json();
  if (c.contains("cache_evictions") && c["cache_evictions"].get<uint64_t>() > 0) {
    throw ModelError("--preload-experts: the expert cache cannot hold all " + std::to_string(n) + " experts (" +
                     std::to_string(c["cache_evictions"].get<uint64_t>()) + " evicted); give --cache-mib the pack's size");
  }
  return n;
}

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
