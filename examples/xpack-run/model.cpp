// Architecture dispatch: the GGUF's general.architecture picks the model file.
#include "model.h"

namespace xrun {

std::unique_ptr<Model> make_model(const Weights& w, Backend& be, ExpertSource* experts) {
  const std::string& arch = w.arch();
  if (arch == "llama") return make_llama(w, be, experts);
  if (arch == "deepseek4") return make_deepseek4(w, be, experts);
  if (arch == "kimi-k3") return make_kimi_k3(w, be, experts);
  throw ModelError("unsupported architecture " + arch);
}

}  // namespace xrun
