// A host-memory expert source (the plain GGUF's mapping) for a device backend:
// the backend cannot read host bytes, so each (layer, expert) is uploaded the
// first time it is asked for and kept. Fine for the small models the plain-GGUF
// path serves; a large model goes through the pack and the device cache.
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "experts_factory.h"

namespace xrun {

namespace {

struct UploadedRequest final : ExpertRequest {
  std::vector<const ExpertWeights*> experts;
  bool resident(int) const override { return true; }
  ExpertReady get(int i) override { return {experts.at(static_cast<size_t>(i)), nullptr}; }
  void release(int) override {}
};

class UploadedExperts final : public ExpertSource {
 public:
  UploadedExperts(std::unique_ptr<ExpertSource> host, Backend& be) : host_(std::move(host)), be_(be) {}

  bool has_layer(int layer) const override { return host_->has_layer(layer); }
  int n_experts() const override { return host_->n_experts(); }

  std::unique_ptr<ExpertRequest> acquire(int layer, const int32_t* experts, int n, void*) override {
    // The host source's request is finished on the host: its bytes are only read by upload().
    std::unique_ptr<ExpertRequest> from = host_->acquire(layer, experts, n, nullptr);
    auto req = std::make_unique<UploadedRequest>();
    req->experts.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const std::pair<int, int> key{layer, experts[i]};
      auto it = uploaded_.find(key);
      if (it == uploaded_.end()) {
        const ExpertReady host = from->get(i);
        if (host.ready_event) throw ModelError("expert source: a device event where host bytes were expected");
        ExpertWeights dev;
        dev.expert = host.weights->expert;
        for (const auto& [role, t] : host.weights->roles) {
          dev.roles.emplace_back(role, be_.upload(t.type, t.data, t.width(), t.rows()));
          bytes_ += t.nbytes();
        }
        it = uploaded_.emplace(key, std::move(dev)).first;
      }
      from->release(i);
      req->experts[static_cast<size_t>(i)] = &it->second;
    }
    return req;
  }

  void finish() override { host_->finish(); }
  nlohmann::ordered_json counters_json() const override { return host_->counters_json(); }
  uint64_t device_bytes() const override { return bytes_; }

 private:
  std::unique_ptr<ExpertSource> host_;
  Backend& be_;
  std::map<std::pair<int, int>, ExpertWeights> uploaded_;
  uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<ExpertSource> make_uploaded_experts(std::unique_ptr<ExpertSource> host, Backend& be) {
  if (!host) return nullptr;
  return std::make_unique<UploadedExperts>(std::move(host), be);
}

}  // namespace xrun
