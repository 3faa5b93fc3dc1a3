// The compute backend `--device` names. The CUDA one exists only in a build
// configured with -Dcuda=enabled (cuda_backend.cpp); otherwise
// cuda_backend_stub.cpp stands in and says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend.h"

namespace xrun {

// xpack-run's CUDA flags.
struct CudaBackendOptions {
  bool graphs = false;         // --cuda-graphs: each stretch of a decode step as one CUDA graph
  int mma_large_from = 0;      // --mma-large-from: prefill products of this many tokens or more in
                               // the tensor cores' largest tiles (0: the rule; the setting is the process's)
  bool no_dp4a = false;        // --no-dp4a: K-quant and MXFP4 decode on the FMA units (the
                               // setting is the process's, as mma_large_from's)
  size_t workspace_bytes = 0;  // --workspace-mib: the matrix products' workspace (0: fitted to
                               // the trunk by cuda_fit_workspace, at least 64 MiB)
};

// The CUDA backend on device 0, set up as `o` says. Throws ModelError naming
// what is missing: a build without CUDA, no CUDA device (or no usable driver).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o = {});

// Once the model is loaded, before the expert cache takes the free VRAM: a
// CUDA backend's products' workspace grown to fit the trunk's largest product
// (CudaBackend::fit_workspace), unless --workspace-mib set it. No-op for any
// other backend.
void cuda_fit_workspace(Backend& be);

// What a CUDA backend holds in VRAM now, for the load-time plan on stderr:
// trunk weights, other live tensors (KV caches, states), the matrix-product
// workspace, the expert cache (`expert_cache_bytes`, held by libxpack), and the
// device's free and total memory. "" for any other backend.
std::string cuda_vram_plan(Backend& be, uint64_t expert_cache_bytes);

// How often a CUDA backend launched a step's stretch as a CUDA graph, and how
// many of those graphs were updates of a kept executable rather than new
// ones. Zeros for any other backend.
struct CudaGraphCounts {
  int64_t launches = 0, updates = 0, instantiations = 0;
};
CudaGraphCounts cuda_graph_counts(Backend& be);

// Seconds the host has spent waiting for a CUDA backend's GPU (its downloads:
// a step's router ids and logits), from the backend's start; 0 without one.
// Over a decode, the rest of the time is the host's own (building and
// enqueueing the step), so a small share means the host, not the GPU, sets
// the step time.
double cuda_host_wait_s(Backend& be);

// --profile-ops (cuda_op_profile.h) on a CUDA backend: cuda_profile_section
// starts timing (or a new section of the table: "prefill", "decode"),
// cuda_profile_report is the table. Without a CUDA backend: no-op and "".
void cuda_profile_section(Backend& be, const std::string& name);
std::string cuda_profile_report(Backend& be);

}  // namespace xrun
