// Architecture dispatch (the GGUF's general.architecture picks the model file)
// and the checks and output every architecture's eval shares.
#include "model.h"

#include <nlohmann/json.hpp>

#include "xpack/xpack.h"

namespace xrun {

nlohmann::ordered_json Model::counters_json() const { return nlohmann::ordered_json::object(); }

std::unique_ptr<NextLayerGuesser> make_guesser(const ModelOptions& o, int64_t n_expert) {
  if (o.prefetch_next <= 0) return nullptr;
  auto g = std::make_unique<NextLayerGuesser>(o.prefetch_next, o.guess_state);
  g->check_experts(n_expert);
  return g;
}

std::unique_ptr<Model> make_model(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o) {
  const std::string& arch = w.arch();
  if (arch == "llama") return make_llama(w, be, experts, o);
  if (arch == "deepseek4") return make_deepseek4(w, be, experts, o);
  if (arch == "kimi-k3") return make_kimi_k3(w, be, experts, o);
  throw ModelError("unsupported architecture " + arch);
}

void check_eval(const char* arch, const int32_t* tokens, int n, int pos0, int64_t n_past, int64_t n_vocab) {
  if (pos0 != n_past) {
    throw ModelError(std::string(arch) + ": eval at position " + std::to_string(pos0) + " but " +
                     std::to_string(n_past) + " tokens were evaluated (the sequence must continue)");
  }
  for (int t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= n_vocab) {
      throw ModelError(std::string(arch) + ": token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                       std::to_string(n_vocab));
    }
  }
}

void download_logits(Backend& be, const Tensor& output, const Tensor& x, float* logits, LogitRows rows) {
  const int64_t n = x.rows(), first = rows == LogitRows::last ? n - 1 : 0;
  const Tensor out = be.empty(XPACK_TYPE_F32, output.rows(), n - first);  // the products write every row
  // The last row is always its own product, so the sampled token does not depend
  // on whether the other rows were asked for (a batch may take another kernel).
  if (n - 1 > first) be.matmul(output, x.row_range(first, n - 1 - first), out.row_range(0, n - 1 - first));
  be.matmul(output, x.row_range(n - 1, 1), out.row_range(n - 1 - first, 1));
  be.download(out, logits);
}

}  // namespace xrun
