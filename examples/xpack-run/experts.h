// Where routed experts come from: the Expert Pack through libxpack (streamed,
// cached) or, for a plain unconverted GGUF, the GGUF's own 3-D expert tensors.
// Models never see the difference: both hand out the same bytes.
#pragma once

#include <cstdint>
#include <functional>
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
  // Calls fn once for each of the `n` distinct experts of `layer`, in the order
  // given, with its weights; a view is valid only during its call. Every
  // requested expert is delivered (never skipped); a failure throws ModelError.
  // A source may load later experts while fn computes earlier ones, and may
  // reuse an expert's memory once its call returned: so a layer wider than the
  // cache streams through it without copies.
  using ExpertFn = std::function<void(const ExpertWeights&)>;
  virtual void for_each(int layer, const int32_t* experts, int n, const ExpertFn& fn) = 0;
  // Called once after the run: reports what could only fail late (an
  // incomplete routing trace) by throwing ModelError.
  virtual void finish() {}
  // Engine counters as a JSON object text (for --json / --stats), or "{}".
  virtual std::string counters_json() const { return "{}"; }
};

}  // namespace xrun
