// The CUDA backend: tensors in device memory, every operation enqueued on one
// non-blocking compute stream. Trunk weights are uploaded once in their GGUF
// block formats (cudaMalloc); activations and states come from the backend's
// CudaTensorPool (zero-filled with cudaMemsetAsync by alloc(), not by empty()),
// which reuses a released block for work enqueued after the release, so a graph
// may drop a temporary as soon as its users are enqueued. Matrix products go through cuda/quant_matmul.h's
// fp32 path (matvec up to 8 tokens, exactly dequantized tiles + SGEMM beyond);
// the other operations are cuda/runtime_ops.h. The host waits only in
// download() (and in get_rows of a quantized table, which reads the ids).
//
// Built only with -Dcuda=enabled; links the xpack_kernels library and the CUDA
// runtime, never libxpack's internals.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <vector>

#include "backend.h"
#include "cuda_op_profile.h"
#include "cuda_tensor_pool.h"
#include "device_backend.h"
#include "quant_matmul.h"

namespace xrun {

class CudaBackend final : public Backend {
 public:
  // Throws ModelError when the device or the stream cannot be set up.
  // kernels_workspace: the matrix products' workspace in bytes (0: the kernels'
  // default, 64 MiB).
  explicit CudaBackend(int ordinal, size_t kernels_workspace = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }

  Tensor alloc(uint32_t type, int64_t width, int64_t rows) override;
  Tensor empty(uint32_t type, int64_t width, int64_t rows) override;
  Tensor weight(const WeightTensor& w) override;
  Tensor upload(uint32_t type, const void* host, int64_t width, int64_t rows) override;
  void download(const Tensor& src, void* host) override;
  void start_download(const Tensor& src) override;
  void finish_download(void* host) override;
  void copy(const Tensor& src, const Tensor& dst) override;

  void* stream() override { return state_->stream; }
  void wait_event(void* event) override;
  void capture_until_download(int64_t tokens, bool step_start) override;

  void matmul(const Tensor& w, const Tensor& x, const Tensor& y) override;
  void grouped_matmul(const std::vector<GroupedProblem>& problems, const Tensor& x, const Tensor& y) override;
  void shared_input_matmul(const Tensor& x, const std::vector<Product>& products) override;
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void set_rows(const Tensor& src, const Tensor& ids, const Tensor& dst) override;
  void rms_norm(const Tensor& x, const Tensor* weight, float eps, const Tensor& y) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void l2_norm(const Tensor& x, float eps, const Tensor& y) override;
  void scale(const Tensor& x, float s, const Tensor& out) override;
  void unary(Unary f, const Tensor& x, const Tensor& out) override;
  void rope(const Tensor& x, const RopeSpec& spec, int64_t pos0, int64_t pos_step, bool inverse) override;
  void rms_norm_rope(const Tensor& x, const Tensor* weight, float eps, const RopeSpec& spec, int64_t pos0) override;
  void swiglu(const Tensor& gate, const Tensor& up, float limit, const Tensor& out) override;
  void softmax_rows(const Tensor& x) override;
  void top_k(const Tensor& scores, const Tensor& ids) override;
  void take(const Tensor& values, const Tensor& ids, const Tensor& out) override;
  void normalize_rows(const Tensor& x, float floor) override;
  void route(const Tensor& logits, const RouteSpec& spec, const Tensor& ids, const Tensor& weights) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_head_kv,
                 int64_t pos0, float scale, const Tensor& out) override;
  void combine_picks(const Tensor& ys, const Tensor& rows, const Tensor& weights, int64_t k, bool accumulate,
                     const Tensor& out) override;

  // Device bytes held: weight() uploads, other live tensors, blocks the
  // tensor pool keeps for reuse, the workspace.
  uint64_t weight_bytes() const { return state_->weight_bytes.load(); }
  uint64_t tensor_bytes() const { return state_->tensor_bytes.load(); }
  uint64_t pooled_bytes() const { return state_->pool ? state_->pool->cached_bytes() : 0; }
  uint64_t workspace_bytes() const;  // the context's workspace and cuBLAS's

  // Once the trunk is loaded (weight() has seen every matrix; experts come
  // through upload() and do not count), and unless the constructor was given a
  // size (--workspace-mib): the products' workspace grown to hold the largest
  // trunk product's split activations for kWorkspaceRows tokens, at most a 32nd
  // of the device's memory. At 64 MiB a 4096-token Kimi-K3 prompt's
  // 33792-input product went in 13 batches of too few tiles to fill the GPU
  // evenly, and the prompt ran 0.91x of the same run with the whole prompt in
  // one batch (doc/xpack-run.md, "The matmul workspace"). Waits for the stream. Throws
  // ModelError when the memory cannot be had.
  void fit_workspace();
  static constexpr int64_t kWorkspaceRows = 4096;
  int ordinal() const { return ordinal_; }

  // CUDA graphs for the stretches of decode-sized steps (capture_until_download)
  // when turned on here (--cuda-graphs), except while profiling. Off by
  // default: capturing and updating every step's graphs again costs the host
  // more than launching their kernels one by one (doc/xpack-run.md).
  void set_graphs(bool on) { graphs_ = on; }
  CudaGraphCounts graph_counts() const { return graph_counts_; }
  // Seconds the host has waited for the GPU in download() and upload()
  // (cudaStreamSynchronize), from the start.
  double host_wait_s() const { return host_wait_s_; }

  // --profile-ops (cuda_op_profile.h): from now on every operation is timed.
  void enable_profile();
  // nullptr unless enabled; the model's own CUDA operations time themselves with it.
  OpProfile* profile() { return profile_.get(); }

  // The kernels' context, for model operations that run cuBLAS products
  // (kernels::float_gemm) on the compute stream.
  xpack::kernels::Context* kernels_context() { return ctx_; }

 private:
  // Outlives the backend while tensors do: their deleters free on its stream.
  struct State {
    int ordinal = 0;
    cudaStream_t stream = nullptr;
    std::unique_ptr<CudaTensorPool> pool;  // on `stream`
    std::atomic<uint64_t> weight_bytes{0}, tensor_bytes{0};
    ~State();
  };

  Tensor raw_alloc(uint32_t type, int64_t width, int64_t rows);
  // Ends the capture: the stretch's graph updated into (or instantiated as)
  // the executable kept for its place in the step, and launched.
  void launch_capture();
  // Ends a capture that an operation's exception left open, launching nothing:
  // at the next step's start and in the destructor.
  void drop_capture();
  // Host bytes copied to pinned memory that stays untouched until the next
  // download(): an upload's source while capturing.
  const void* stage_upload(const void* host, size_t n);

  int ordinal_;
  std::shared_ptr<State> state_;
  xpack::kernels::Context* ctx_ = nullptr;
  size_t asked_workspace_ = 0;  // the constructor's kernels_workspace (0: fit_workspace decides)
  size_t largest_split_ = 0;    // the largest trunk product's split for kWorkspaceRows tokens
  std::unique_ptr<OpProfile> profile_;
  // download()'s pinned buffer, grown on demand; larger downloads (every
  // prompt row's logits) go straight to the caller's memory.
  static constexpr size_t kMaxBounceBytes = size_t(64) << 20;
  void* bounce_ = nullptr;
  size_t bounce_bytes_ = 0;
  // start_download's copy: its own pinned buffer (kMaxEarlyBytes) and the
  // event recorded behind it, which finish_download waits for.
  static constexpr size_t kMaxEarlyBytes = size_t(1) << 20;
  // upload() stages copies up to this size in pinned memory (stage_upload).
  static constexpr size_t kMaxStagedUploadBytes = size_t(256) << 10;
  void* early_ = nullptr;
  size_t early_bytes_ = 0;  // the started copy's size
  bool early_started_ = false;
  cudaEvent_t early_done_ = nullptr;
  double host_wait_s_ = 0;  // host_wait_s()
  // cudaStreamSynchronize on the compute stream, its time added to host_wait_s_.
  void sync_stream(const char* what);

  // CUDA graphs: the capture in progress, and one executable per (place in
  // the step, node count) seen, updated in place by later steps.
  static constexpr int64_t kMaxGraphTokens = 8;  // the matvec path; larger batches go through cuBLAS
  bool graphs_ = false;
  bool capturing_ = false;
  int64_t capture_tokens_ = 0;
  int capture_place_ = 0;
  cudaStream_t side_ = nullptr;  // allocations while capturing (CudaTensorPool::begin_capture)
  struct Replay {
    int place;
    size_t nodes;
    cudaGraphExec_t exec;
  };
  std::vector<Replay> replays_;
  CudaGraphCounts graph_counts_;
  struct PinnedChunk {
    void* p;
    size_t bytes;
  };
  std::vector<PinnedChunk> staging_;  // stage_upload's memory, reused after each download()
  size_t staging_chunk_ = 0, staging_used_ = 0;
};

}  // namespace xrun
