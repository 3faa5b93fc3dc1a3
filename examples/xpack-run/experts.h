// Where routed experts come from: the Expert Pack through libxpack (streamed,
// cached) or, for a plain unconverted GGUF, the GGUF's own 3-D expert tensors.
// Models never see the difference: both hand out the same bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xrun {

// One expert role's weights as a 2-D matrix: ne0 inputs (contiguous) x ne1 outputs.
struct ExpertMatrix {
  uint32_t type = 0;
  int64_t ne0 = 0, ne1 = 0;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// The roles of one (layer, expert) object, looked up by role name.
struct ExpertWeights {
  int expert = -1;
  // Role names as in the GGUF tensor name: "gate", "up", "down", "gate_up".
  const ExpertMatrix* role(const char* name) const;
  std::vector<std::pair<std::string, ExpertMatrix>> roles;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // True if GGUF block `layer` has routed experts.
  virtual bool has_layer(int layer) const = 0;
  virtual int n_experts() const = 0;
  // Makes the weights of `n` distinct experts of `layer` available. The views
  // stay valid until release(layer). Every requested expert is delivered (never
  // skipped); a failure throws ModelError.
  virtual void acquire(int layer, const int32_t* experts, int n,
                       std::vector<ExpertWeights>& out) = 0;
  virtual void release(int layer) = 0;
  // Engine counters as a JSON object text (for --json / --stats), or "{}".
  virtual std::string counters_json() const { return "{}"; }
};

}  // namespace xrun
