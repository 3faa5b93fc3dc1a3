// --device cuda in a build without CUDA: a clear refusal instead of a backend.
#include "device_backend.h"

namespace xrun {

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  throw ModelError(
      "--device cuda: this xpack-run was built without CUDA (configure with meson setup -Dcuda=enabled); "
      "use --device cpu");
}

void cuda_fit_workspace(Backend&) {}
std::string cuda_vram_plan(Backend&, uint64_t) { return ""; }
CudaGraphCounts cuda_graph_counts(Backend&) { return {}; }
double cuda_host_wait_s(Backend&) { return 0.0; }
void cuda_profile_section(Backend&, const std::string&) {}
std::string cuda_profile_report(Backend&) { return ""; }

}  // namespace xrun
