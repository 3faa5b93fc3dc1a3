// Routed experts of a plain (unconverted) GGUF: expert e of a 3-D tensor
// [ne0, ne1, n_expert] is the contiguous byte range e * nbytes / n_expert,
// the same bytes xpack-build copies into the pack, so both paths compute alike.
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "experts_factory.h"

namespace xrun {

namespace {

constexpr const char* kRoles[] = {"gate", "up", "down", "gate_up"};

// Views of the mapping: always resident, nothing to wait for or give back.
struct MappedRequest final : ExpertRequest {
  std::vector<ExpertWeights> experts;
  bool resident(int) const override { return true; }
  ExpertReady get(int i) override { return {&experts.at(static_cast<size_t>(i)), nullptr}; }
  void release(int) override {}
};

class GgufExperts final : public ExpertSource {
 public:
  explicit GgufExperts(const Weights& w) {
    // Probe every block the metadata declares (plus slack for extra blocks such
    // as MTP layers that some converters append after block_count).
    const int64_t n_blocks = w.get_int(w.arch_key("block_count"), 0) + 8;
    for (int64_t layer = 0; layer < n_blocks; ++layer) {
      std::vector<std::pair<std::string, const WeightTensor*>> roles;
      for (const char* r : kRoles) {
        std::string name = "blk." + std::to_string(layer) + ".ffn_" + r + "_exps.weight";
        if (const WeightTensor* t = w.find(name)) {
          if (t->n_dims != 3) throw ModelError("expert tensor " + name + " is not 3-D");
          if (n_experts_ == 0) n_experts_ = static_cast<int>(t->ne[2]);
          if (t->ne[2] != n_experts_) {
            throw ModelError("expert tensor " + name + " has " + std::to_string(t->ne[2]) +
                             " experts, expected " + std::to_string(n_experts_));
          }
          roles.emplace_back(r, t);
        }
      }
      if (!roles.empty()) layers_[static_cast<int>(layer)] = std::move(roles);
    }
  }

  bool empty() const { return layers_.empty(); }
  bool has_layer(int layer) const override { return layers_.count(layer) != 0; }
  int n_experts() const override { return n_experts_; }

  std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n, void*) override {
    auto it = layers_.find(layer);
    if (it == layers_.end()) throw ModelError("layer " + std::to_string(layer) + " has no routed experts");
    ++acquires_;
    auto req = std::make_unique<MappedRequest>();
    req->experts.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      int e = experts[i];
      if (e < 0 || e >= n_experts_) throw ModelError("expert id " + std::to_string(e) + " out of range");
      ExpertWeights& w = req->experts[static_cast<size_t>(i)];
      w.expert = e;
      for (const auto& [rname, t] : it->second) {
        const size_t nbytes = t->nbytes / static_cast<size_t>(n_experts_);
        w.roles.emplace_back(rname, borrowed_tensor(t->type, t->ne[0], t->ne[1],
                                                    static_cast<const uint8_t*>(t->data) + nbytes * static_cast<size_t>(e)));
      }
      ++served_;
    }
    return req;
  }

  nlohmann::ordered_json counters_json() const override {
    return {{"source", "gguf"}, {"acquire_calls", acquires_}, {"experts_served", served_}};
  }

 private:
  std::map<int, std::vector<std::pair<std::string, const WeightTensor*>>> layers_;
  int n_experts_ = 0;
  uint64_t acquires_ = 0, served_ = 0;
};

}  // namespace

std::unique_ptr<ExpertSource> make_gguf_experts(const Weights& w) {
  auto src = std::make_unique<GgufExperts>(w);
  if (src->empty()) return nullptr;
  return src;
}

}  // namespace xrun
