// CudaBackend (cuda_backend.h): memory, copies and the operations, each a
// shape check (the CPU backend's) and one enqueue on the compute stream.
#include "cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device_backend.h"
#include "quant_matmul.h"
#include "quant_mma.h"
#include "runtime_ops.h"
#include "xpack/xpack.h"

namespace xrun {

namespace xk = xpack::kernels;

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw ModelError(std::string("CUDA: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

void check_shape(bool ok, const char* what) {
  if (!ok) throw ModelError(std::string("backend: ") + what);
}

bool is_f32(const Tensor& t) { return t.type == XPACK_TYPE_F32; }
bool same_shape(const Tensor& a, const Tensor& b) { return a.width() == b.width() && a.rows() == b.rows(); }

size_t padded(size_t bytes) { return (std::max<size_t>(bytes, 1) + 255) / 256 * 256; }

// A product's row in --profile-ops: weight type, in x out, and decode (1..8 rows) or batch.
std::string shape_key(const Tensor& w, int64_t n) {
  return std::string(xk::type_name(w.type)) + " " + std::to_string(w.width()) + "x" + std::to_string(w.rows()) +
         (n <= 8 ? " n" + std::to_string(n) : " batch");
}

// rope()'s per-call constants exactly as rope_yarn_cache computes them on the CPU.
xpack::rt::RopeParams rope_params(const RopeSpec& spec) {
  const RopeYarn& a = spec.angles;
  xpack::rt::RopeParams p{};
  p.n_dims = a.n_dims;
  p.theta_scale = std::pow(a.freq_base, -2.0f / static_cast<float>(a.n_dims));
  p.freq_scale = a.freq_scale;
  p.ext_factor = a.ext_factor;
  p.attn_factor = a.attn_factor;
  p.mscale_ext = a.attn_factor;
  if (a.ext_factor != 0.0f) {
    const float start = std::floor(rope_detail::yarn_corr_dim(a.n_dims, a.n_ctx_orig, a.beta_fast, a.freq_base));
    const float end = std::ceil(rope_detail::yarn_corr_dim(a.n_dims, a.n_ctx_orig, a.beta_slow, a.freq_base));
    p.corr0 = std::max(0.0f, start);
    p.corr1 = std::min(static_cast<float>(a.n_dims - 1), end);
    p.mscale_ext *= 1.0f + 0.1f * std::log(1.0f / a.freq_scale);
  }
  return p;
}

// The products that are never an expert's (matmul, shared_input_matmul) of at most
// kTrunkDecodeRows rows take the decode kernel up to its 8 tokens. Alone, such a
// product gives the tensor-core tiles a grid of at most 32 blocks, and the decode
// kernel was 2.7-6x faster at 2 to 8 tokens on every shape measured, 2048-4096 rows
// (H100, 2026-12-06, doc/kernels.md, "Decode, 2026-12-06, evening"). Taller products,
// whose tiles fill more of the GPU, were not measured both ways and keep the kernels'
// default, as do the experts (grouped_matmul): a prompt's experts fill the GPU, and
// there the tiles were 1.5-1.9x faster at 8 tokens for MXFP4 (Q2_K and Q3_K take
// their decode kernel to 8 tokens by default: cuda/quant_matmul.cu). Either rule is the problem's own,
// so a product's bits never depend on which launch took it.
constexpr int64_t kTrunkDecodeRows = 4096;
const xk::MatmulOptions* trunk_options(int64_t rows) {
  static const xk::MatmulOptions o = [] {
    xk::MatmulOptions m{};
    m.size = sizeof m;
    m.matvec_max_tokens = xk::kMaxMatvecTokens;
    return m;
  }();
  return rows <= kTrunkDecodeRows ? &o : nullptr;
}

}  // namespace

CudaBackend::State::~State() {
  cudaSetDevice(ordinal);
  cudaStreamSynchronize(stream);
  pool.reset();
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

CudaBackend::CudaBackend(int ordinal, size_t kernels_workspace) : ordinal_(ordinal), state_(std::make_shared<State>()) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    throw ModelError(std::string("--device cuda: no CUDA device (cudaGetDeviceCount: ") +
                     (e != cudaSuccess ? std::string(cudaGetErrorName(e)) + ", " + cudaGetErrorString(e)
                                       : std::string("0 devices")) +
                     "); use --device cpu");
  }
  if (ordinal < 0 || ordinal >= count) {
    throw ModelError("--device cuda: CUDA device " + std::to_string(ordinal) + " does not exist (" +
                     std::to_string(count) + " found)");
  }
  check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
  state_->ordinal = ordinal;
  check_cuda(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  state_->pool = std::make_unique<CudaTensorPool>(state_->stream);
  // Large tensors are allocated and freed every layer of a prompt: keep the
  // stream pool's memory instead of handing it back at each synchronisation.
  cudaMemPool_t stream_pool;
  check_cuda(cudaDeviceGetDefaultMemPool(&stream_pool, ordinal), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(stream_pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate (allocations)");
  const int st = xk::context_create(&ctx_, kernels_workspace);
  if (st != xk::kOk) throw ModelError(std::string("CUDA: matmul context: ") + xk::status_name(st));
  asked_workspace_ = kernels_workspace;
}

uint64_t CudaBackend::workspace_bytes() const {
  return xk::context_workspace_bytes(ctx_) + xk::kBlasWorkspaceBytes;
}

void CudaBackend::fit_workspace() {
  if (asked_workspace_ != 0) return;
  size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const size_t want = std::min(largest_split_, std::max(xk::kDefaultWorkspaceBytes, total_b / 32));
  if (want <= xk::context_workspace_bytes(ctx_)) return;
  sync_stream("cudaStreamSynchronize (workspace)");
  const int st = xk::context_reserve(ctx_, want);
  if (st != xk::kOk) {
    throw ModelError("CUDA: the matrix products' workspace of " + std::to_string(want >> 20) +
                     " MiB cannot be allocated (" + xk::status_name(st) + "); --workspace-mib sets a smaller one");
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(ordinal_);
  drop_capture();
  cudaStreamSynchronize(state_->stream);
  for (const Replay& r : replays_) cudaGraphExecDestroy(r.exec);
  for (const PinnedChunk& c : staging_) cudaFreeHost(c.p);
  if (side_) cudaStreamDestroy(side_);
  profile_.reset();
  if (bounce_) cudaFreeHost(bounce_);
  if (early_) cudaFreeHost(early_);
  if (early_done_) cudaEventDestroy(early_done_);
  xk::context_destroy(ctx_);
}

Tensor CudaBackend::raw_alloc(uint32_t type, int64_t width, int64_t rows) {
  check_shape(width >= 0 && rows >= 0, "alloc of a negative shape");
  Tensor t;
  t.type = type;
  t.ne[0] = width;
  t.ne[1] = rows;
  const size_t asked = t.nbytes(), bytes = CudaTensorPool::class_bytes(asked);
  cudaError_t e = cudaSuccess;
  void* p = state_->pool->acquire(asked, &e);
  if (!p) check_cuda(e, ("allocation of " + std::to_string(asked) + " bytes").c_str());
  state_->tensor_bytes += bytes;
  std::shared_ptr<State> st = state_;
  t.storage = std::shared_ptr<void>(p, [st, asked, bytes](void* q) {
    st->pool->release(q, asked);
    st->tensor_bytes -= bytes;
  });
  t.data = p;
  return t;
}

Tensor CudaBackend::alloc(uint32_t type, int64_t width, int64_t rows) {
  const OpProfile::Scope timed(profile_.get(), "alloc");
  Tensor t = raw_alloc(type, width, rows);
  check_cuda(cudaMemsetAsync(t.data, 0, CudaTensorPool::class_bytes(t.nbytes()), state_->stream), "cudaMemsetAsync");
  return t;
}

Tensor CudaBackend::empty(uint32_t type, int64_t width, int64_t rows) {
  const OpProfile::Scope timed(profile_.get(), "empty");
  return raw_alloc(type, width, rows);
}

Tensor CudaBackend::weight(const WeightTensor& w) {
  Tensor t;
  t.type = w.type;
  t.ne[0] = w.ne[0];
  t.ne[1] = w.rows();
  const size_t n = t.nbytes();
  check_shape(n <= w.nbytes, "weight larger than its bytes");
  const size_t bytes = padded(n);
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), ("cudaMalloc of weight " + w.name).c_str());
  // From the mapping (pageable): the call returns once the bytes are staged.
  check_cuda(cudaMemcpyAsync(p, w.data, n, cudaMemcpyHostToDevice, state_->stream), "cudaMemcpyAsync (weight)");
  state_->weight_bytes += bytes;
  largest_split_ = std::max(largest_split_, xk::dev::mma_split_bytes(t.type, t.width(), kWorkspaceRows));
  std::shared_ptr<State> st = state_;
  t.storage = std::shared_ptr<void>(p, [st, bytes](void* q) {
    cudaFree(q);
    st->weight_bytes -= bytes;
  });
  t.data = p;
  return t;
}

Tensor CudaBackend::upload(uint32_t type, const void* host, int64_t width, int64_t rows) {
  const OpProfile::Scope timed(profile_.get(), "upload");
  Tensor t = raw_alloc(type, width, rows);
  if (t.nbytes() == 0) return t;
  // A graph copies from memory that outlives the call, and only from pinned
  // memory. Small uploads (index lists) are staged too: from pageable memory
  // the driver may wait for the stream before staging the copy itself, which
  // would make the host wait for the work start_download lets run on.
  if (capturing_ || t.nbytes() <= kMaxStagedUploadBytes) {
    check_cuda(cudaMemcpyAsync(t.data, stage_upload(host, t.nbytes()), t.nbytes(), cudaMemcpyHostToDevice,
                               state_->stream),
               "cudaMemcpyAsync (upload, staged)");
    return t;
  }
  check_cuda(cudaMemcpyAsync(t.data, host, t.nbytes(), cudaMemcpyHostToDevice, state_->stream), "cudaMemcpyAsync (upload)");
  // From pageable memory the copy has been staged when the call returns; from
  // pinned memory it has not, and the caller may reuse its buffer at once.
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
    sync_stream("cudaStreamSynchronize (upload)");
  }
  cudaGetLastError();  // an unregistered pointer may leave an error there on old runtimes
  return t;
}

void CudaBackend::download(const Tensor& src, void* host) {
  if (capturing_) launch_capture();
  {
    const OpProfile::Scope timed(profile_.get(), "download");
    const size_t n = src.nbytes();
    // Through a pinned buffer: into pageable memory the driver copies through
    // a staging buffer of its own; into pinned memory the copy is one DMA,
    // and the memcpy of a router's ids here costs nothing.
    const bool bounce = n > 0 && n <= kMaxBounceBytes;
    if (bounce && n > bounce_bytes_) {
      if (bounce_) cudaFreeHost(bounce_);
      bounce_ = nullptr;
      bounce_bytes_ = 0;
      const size_t want = std::max<size_t>(n, size_t(1) << 20);
      check_cuda(cudaMallocHost(&bounce_, want), "cudaMallocHost (download buffer)");
      bounce_bytes_ = want;
    }
    if (n > 0) {
      check_cuda(cudaMemcpyAsync(bounce ? bounce_ : host, src.data, n, cudaMemcpyDeviceToHost, state_->stream),
                 "cudaMemcpyAsync (download)");
    }
    sync_stream("cudaStreamSynchronize (download)");
    if (bounce) std::memcpy(host, bounce_, n);
    staging_chunk_ = staging_used_ = 0;  // every staged upload has been copied
  }
  // After the scope: folding the step's events into the totals costs the host
  // about a microsecond an event, which inside the scope counted as download's.
  if (profile_) profile_->collect();
}

void CudaBackend::start_download(const Tensor& src) {
  const size_t n = src.nbytes();
  // Profiled or captured stretches, and large tensors, take download() at the finish.
  early_started_ = false;  // one left unfinished by an exception is dropped
  if (profile_ || capturing_ || n == 0 || n > kMaxEarlyBytes) {
    Backend::start_download(src);
    return;
  }
  if (!early_) check_cuda(cudaMallocHost(&early_, kMaxEarlyBytes), "cudaMallocHost (early download buffer)");
  if (!early_done_) check_cuda(cudaEventCreateWithFlags(&early_done_, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaMemcpyAsync(early_, src.data, n, cudaMemcpyDeviceToHost, state_->stream), "cudaMemcpyAsync (download)");
  check_cuda(cudaEventRecord(early_done_, state_->stream), "cudaEventRecord (download)");
  early_bytes_ = n;
  early_started_ = true;
}

void CudaBackend::finish_download(void* host) {
  if (!early_started_) {
    Backend::finish_download(host);
    return;
  }
  early_started_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t e = cudaEventSynchronize(early_done_);
  host_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check_cuda(e, "cudaEventSynchronize (download)");
  std::memcpy(host, early_, early_bytes_);
}

void CudaBackend::sync_stream(const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t e = cudaStreamSynchronize(state_->stream);
  host_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check_cuda(e, what);
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  const OpProfile::Scope timed(profile_.get(), "copy");
  check_shape(src.type == dst.type && src.numel() == dst.numel(), "copy between different tensors");
  if (src.nbytes() == 0) return;
  check_cuda(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, state_->stream),
             "cudaMemcpyAsync (copy)");
}

void CudaBackend::wait_event(void* event) {
  const OpProfile::Scope timed(profile_.get(), "wait_event");
  if (!event) return;
  // Launched kernel by kernel the wait is enqueued whatever the event's state:
  // cheaper for the host than asking first (0.9 against 1.6-1.9 us a call,
  // 36 calls a DeepSeek-V4 decode step, H200 machine, 2026-12-04), and a wait
  // on a finished copy costs the GPU nothing.
  if (!capturing_) {
    check_cuda(cudaStreamWaitEvent(state_->stream, static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
    return;
  }
  // A resident expert's copy ended long ago: asking spares a graph a split.
  const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (q == cudaSuccess) return;
  if (q != cudaErrorNotReady) check_cuda(q, "cudaEventQuery");
  // A graph cannot wait on another stream's event: the stretch so far is
  // launched, the wait enqueued, and the rest captured as a stretch of its own.
  launch_capture();
  check_cuda(cudaStreamWaitEvent(state_->stream, static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  capture_until_download(capture_tokens_, false);
}

void CudaBackend::capture_until_download(int64_t tokens, bool step_start) {
  if (step_start) drop_capture();
  if (!graphs_ || profile_ || capturing_ || tokens <= 0 || tokens > kMaxGraphTokens) return;
  if (step_start) capture_place_ = 0;
  // Relaxed: the pool may allocate on its side stream and wait for it meanwhile.
  check_cuda(cudaStreamBeginCapture(state_->stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  state_->pool->begin_capture(side_);
  capturing_ = true;
  capture_tokens_ = tokens;
}

void CudaBackend::drop_capture() {
  if (!capturing_) return;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(state_->stream, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  state_->pool->end_capture();
  capturing_ = false;
}

void CudaBackend::launch_capture() {
  capturing_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(state_->stream, &g);
  if (e != cudaSuccess) {
    if (g) cudaGraphDestroy(g);
    state_->pool->end_capture();
    check_cuda(e, "cudaStreamEndCapture");
  }
  const int place = capture_place_++;
  size_t nodes = 0;
  cudaError_t le = cudaGraphGetNodes(g, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  if (le == cudaSuccess && nodes > 0) {
    for (size_t i = 0; i < replays_.size(); ++i) {
      if (replays_[i].place != place || replays_[i].nodes != nodes) continue;
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(replays_[i].exec, g, &info) == cudaSuccess) {
        exec = replays_[i].exec;
        ++graph_counts_.updates;
      } else {  // the same size, other kernels: replaced below
        cudaGetLastError();
        cudaGraphExecDestroy(replays_[i].exec);
        replays_.erase(replays_.begin() + static_cast<std::ptrdiff_t>(i));
      }
      break;
    }
    if (!exec) {
      le = cudaGraphInstantiate(&exec, g, 0);
      if (le == cudaSuccess) {
        ++graph_counts_.instantiations;
        // A bounded set: places and sizes repeat from step to step.
        if (replays_.size() >= 64) {
          cudaGraphExecDestroy(replays_.front().exec);
          replays_.erase(replays_.begin());
        }
        replays_.push_back({place, nodes, exec});
      }
    }
    if (le == cudaSuccess) le = cudaGraphLaunch(exec, state_->stream);
    if (le == cudaSuccess) ++graph_counts_.launches;
  }
  cudaGraphDestroy(g);
  // After the launch: blocks the stretch released are freed behind its work.
  state_->pool->end_capture();
  check_cuda(le, "launching a step's CUDA graph");
}

const void* CudaBackend::stage_upload(const void* host, size_t n) {
  const size_t need = (n + 255) / 256 * 256;
  while (staging_chunk_ < staging_.size() && staging_used_ + need > staging_[staging_chunk_].bytes) {
    ++staging_chunk_;
    staging_used_ = 0;
  }
  if (staging_chunk_ == staging_.size()) {
    PinnedChunk c{nullptr, std::max<size_t>(need, size_t(1) << 20)};
    check_cuda(cudaMallocHost(&c.p, c.bytes), "cudaMallocHost (upload staging)");
    staging_.push_back(c);
    staging_used_ = 0;
  }
  void* at = static_cast<char*>(staging_[staging_chunk_].p) + staging_used_;
  staging_used_ += need;
  std::memcpy(at, host, n);
  return at;
}

void CudaBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& y) {
  const OpProfile::Scope timed(profile_.get(), "matmul", profile_ ? shape_key(w, x.rows()) : std::string());
  check_shape(is_f32(x) && is_f32(y), "matmul needs F32 activations");
  check_shape(x.width() == w.width() && y.width() == w.rows() && x.rows() == y.rows(), "matmul shapes disagree");
  const int64_t n = x.rows();
  if (n == 0 || w.rows() == 0) return;
  check_shape(n <= INT32_MAX, "matmul: too many tokens");
  Tensor xa = x;
  if (reinterpret_cast<uintptr_t>(x.data) % 16 != 0) {  // a row view: the kernels read 16-byte words
    xa = raw_alloc(XPACK_TYPE_F32, x.width(), n);
    copy(x, xa);
  }
  const int st = xk::matmul(ctx_, w.type, w.data, w.width(), w.rows(), xa.f32(), static_cast<int>(n), y.f32(),
                            trunk_options(w.rows()), state_->stream);
  if (st != xk::kOk) {
    throw ModelError("CUDA matmul of a type-" + std::to_string(w.type) + " " + std::to_string(w.width()) + "x" +
                     std::to_string(w.rows()) + " weight: " + xk::status_name(st) +
                     (st == xk::kErrType ? " (this weight type is not implemented on CUDA yet)" : ""));
  }
}

void CudaBackend::grouped_matmul(const std::vector<GroupedProblem>& problems, const Tensor& x, const Tensor& y) {
  const OpProfile::Scope timed(profile_.get(), "grouped_matmul",
                               profile_ && !problems.empty() ? shape_key(problems.front().w, x.rows()) +
                                                                   " x" + std::to_string(problems.size())
                                                             : std::string());
  check_shape(is_f32(x) && is_f32(y) && x.rows() == y.rows(), "grouped_matmul needs F32 activations of equal rows");
  if (problems.empty()) return;
  const Tensor& w0 = problems.front().w;
  check_shape(x.width() == w0.width() && y.width() == w0.rows(), "grouped_matmul shapes disagree");
  check_shape(x.rows() <= INT32_MAX, "grouped_matmul: too many rows");
  std::vector<xk::ExpertProblem> ps;
  ps.reserve(problems.size());
  for (const GroupedProblem& p : problems) {
    check_shape(p.w.type == w0.type && p.w.width() == w0.width() && p.w.rows() == w0.rows(),
                "grouped_matmul: the experts' weights differ in type or shape");
    check_shape(p.row >= 0 && p.rows >= 0 && p.row + p.rows <= x.rows(), "grouped_matmul: rows out of range");
    if (p.rows > 0) ps.push_back({p.w.data, static_cast<int32_t>(p.row), static_cast<int32_t>(p.rows)});
  }
  if (ps.empty()) return;
  Tensor xa = x;
  if (reinterpret_cast<uintptr_t>(x.data) % 16 != 0) {  // a row view: the kernels read 16-byte words
    xa = raw_alloc(XPACK_TYPE_F32, x.width(), x.rows());
    copy(x, xa);
  }
  const int st = xk::grouped_matmul(ctx_, w0.type, w0.width(), w0.rows(), ps.data(), static_cast<int>(ps.size()),
                                    xa.f32(), y.f32(), x.rows(), nullptr, state_->stream);
  if (st != xk::kOk) {
    throw ModelError("CUDA grouped matmul of " + std::to_string(ps.size()) + " type-" + std::to_string(w0.type) + " " +
                     std::to_string(w0.width()) + "x" + std::to_string(w0.rows()) + " weights: " + xk::status_name(st) +
                     (st == xk::kErrType ? " (this weight type is not implemented on CUDA yet)" : ""));
  }
}

void CudaBackend::shared_input_matmul(const Tensor& x, const std::vector<Product>& products) {
  const int64_t n = x.rows();
  if (n == 0 || n > xk::kMaxMatvecTokens || products.size() < 2 || !is_f32(x) ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0) {  // nothing to share a launch: matmul each
    Backend::shared_input_matmul(x, products);
    return;
  }
  const OpProfile::Scope timed(profile_.get(), "shared_input_matmul",
                               profile_ ? shape_key(*products.front().w, n) + " x" + std::to_string(products.size())
                                        : std::string());
  for (const Product& p : products)  // all before any launch: a refusal leaves every y as it was
    check_shape(is_f32(*p.y) && x.width() == p.w->width() && p.y->width() == p.w->rows() && p.y->rows() == n,
                "shared_input_matmul shapes disagree");
  // One call per weight type and trunk_options, in the order each first appears: a
  // product's options are those its matmul alone would take.
  std::vector<bool> done(products.size(), false);
  std::vector<xk::SharedInputProduct> ps;
  for (size_t i = 0; i < products.size(); ++i) {
    if (done[i]) continue;
    const uint32_t type = products[i].w->type;
    const xk::MatmulOptions* opts = trunk_options(products[i].w->rows());
    ps.clear();
    for (size_t j = i; j < products.size(); ++j) {
      const Tensor &w = *products[j].w, &y = *products[j].y;
      if (done[j] || w.type != type || trunk_options(w.rows()) != opts) continue;
      if (ps.size() == size_t(xk::kMaxSharedInputProducts)) break;  // the rest: a later call
      done[j] = true;
      if (w.rows() > 0) ps.push_back({w.data, w.rows(), y.f32()});
    }
    if (ps.empty()) continue;
    const int st = xk::shared_input_matmul(ctx_, type, x.width(), ps.data(), static_cast<int>(ps.size()), x.f32(),
                                           static_cast<int>(n), opts, state_->stream);
    if (st != xk::kOk) {
      throw ModelError("CUDA products of one input (" + std::to_string(ps.size()) + " type-" + std::to_string(type) +
                       " weights of " + std::to_string(x.width()) + " inputs): " + xk::status_name(st) +
                       (st == xk::kErrType ? " (this weight type is not implemented on CUDA yet)" : ""));
    }
  }
}

void CudaBackend::get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "get_rows");
  const bool ints = out.type == XPACK_TYPE_I32;
  check_shape(ids.type == XPACK_TYPE_I32 && (is_f32(out) || (ints && table.type == XPACK_TYPE_I32)),
              "get_rows needs I32 ids and an F32 output (or I32 from an I32 table)");
  check_shape(out.width() == table.width() && out.rows() == ids.numel(), "get_rows shapes disagree");
  const int64_t n = ids.numel(), width = table.width();
  if (n == 0) return;
  if (table.type == XPACK_TYPE_F32 || table.type == XPACK_TYPE_I32) {
    check_cuda(xpack::rt::gather_words(static_cast<const uint32_t*>(table.data), width, ids.i32(), n,
                                       static_cast<uint32_t*>(out.data), state_->stream),
               "get_rows");
    return;
  }
  // A GGUF-block table (a quantized token_embd): decoded in place on the device.
  const size_t rb = xk::row_bytes(table.type, width);
  if (rb == 0) throw ModelError("get_rows of a type-" + std::to_string(table.type) + " table is not implemented on CUDA yet");
  check_cuda(xpack::rt::get_rows_dequant(table.type, table.data, rb, width, ids.i32(), n, out.f32(), state_->stream),
             "get_rows (dequantized)");
}

void CudaBackend::set_rows(const Tensor& src, const Tensor& ids, const Tensor& dst) {
  const OpProfile::Scope timed(profile_.get(), "set_rows");
  check_shape(is_f32(src) && is_f32(dst) && ids.type == XPACK_TYPE_I32 && src.width() == dst.width() &&
                  ids.numel() == src.rows(),
              "set_rows shapes disagree");
  check_cuda(xpack::rt::set_rows(src.f32(), src.width(), ids.i32(), src.rows(), dst.f32(), state_->stream), "set_rows");
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor* weight, float eps, const Tensor& y) {
  const OpProfile::Scope timed(profile_.get(), "rms_norm");
  check_shape(is_f32(x) && is_f32(y) && same_shape(x, y), "rms_norm shapes disagree");
  check_shape(!weight || (is_f32(*weight) && weight->numel() == x.width()), "rms_norm weight is not one F32 row");
  check_cuda(xpack::rt::rms_norm(x.f32(), weight ? weight->f32() : nullptr, x.width(), x.rows(), eps, y.f32(),
                                 state_->stream),
             "rms_norm");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "add");
  check_shape(is_f32(a) && is_f32(b) && is_f32(out) && same_shape(a, out), "add shapes disagree");
  check_shape(b.width() == a.width() && (b.rows() == a.rows() || b.rows() == 1), "add: b is neither a's shape nor one row");
  check_cuda(xpack::rt::add(a.f32(), b.f32(), a.width(), a.rows(), b.rows(), out.f32(), state_->stream), "add");
}

void CudaBackend::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "mul");
  check_shape(is_f32(a) && is_f32(b) && is_f32(out) && same_shape(a, b) && same_shape(a, out), "mul shapes disagree");
  check_cuda(xpack::rt::mul(a.f32(), b.f32(), a.numel(), out.f32(), state_->stream), "mul");
}

void CudaBackend::l2_norm(const Tensor& x, float eps, const Tensor& y) {
  const OpProfile::Scope timed(profile_.get(), "l2_norm");
  check_shape(is_f32(x) && is_f32(y) && same_shape(x, y), "l2_norm shapes disagree");
  check_cuda(xpack::rt::l2_norm(x.f32(), x.width(), x.rows(), eps, y.f32(), state_->stream), "l2_norm");
}

void CudaBackend::scale(const Tensor& x, float s, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "scale");
  check_shape(is_f32(x) && is_f32(out) && x.numel() == out.numel(), "scale shapes disagree");
  check_cuda(xpack::rt::scale(x.f32(), s, x.numel(), out.f32(), state_->stream), "scale");
}

void CudaBackend::unary(Unary f, const Tensor& x, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "unary");
  check_shape(is_f32(x) && is_f32(out) && x.numel() == out.numel(), "unary shapes disagree");
  check_cuda(xpack::rt::unary(f == Unary::sigmoid ? 0 : 1, x.f32(), x.numel(), out.f32(), state_->stream), "unary");
}

void CudaBackend::rope(const Tensor& x, const RopeSpec& spec, int64_t pos0, int64_t pos_step, bool inverse) {
  const OpProfile::Scope timed(profile_.get(), "rope");
  const int64_t D = spec.head_dim, n_dims = spec.angles.n_dims;
  check_shape(is_f32(x) && D > 0 && x.width() % D == 0 && n_dims <= D && n_dims % 2 == 0,
              "rope: width is not whole heads");
  check_cuda(xpack::rt::rope(x.f32(), x.width(), x.rows(), D, spec.tail ? D - n_dims : 0, rope_params(spec), pos0,
                             pos_step, inverse, state_->stream),
             "rope");
}

void CudaBackend::rms_norm_rope(const Tensor& x, const Tensor* weight, float eps, const RopeSpec& spec, int64_t pos0) {
  const int64_t D = spec.head_dim, n_dims = spec.angles.n_dims;
  if (D <= 0 || D % 2 != 0) return Backend::rms_norm_rope(x, weight, eps, spec, pos0);  // the kernel takes pairs
  const OpProfile::Scope timed(profile_.get(), "rms_norm_rope");
  check_shape(is_f32(x) && x.width() % D == 0 && n_dims <= D && n_dims % 2 == 0, "rms_norm_rope: width is not whole heads");
  check_shape(!weight || (is_f32(*weight) && weight->numel() == D), "rms_norm_rope weight is not one head of F32");
  check_cuda(xpack::rt::rms_norm_rope(x.f32(), weight ? weight->f32() : nullptr, x.width(), x.rows(), D,
                                      spec.tail ? D - n_dims : 0, eps, rope_params(spec), pos0, state_->stream),
             "rms_norm_rope");
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, float limit, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "swiglu");
  check_shape(is_f32(gate) && is_f32(up) && is_f32(out) && same_shape(gate, up) && same_shape(gate, out),
              "swiglu shapes disagree");
  check_cuda(xpack::rt::swiglu(gate.f32(), up.f32(), gate.numel(), limit, out.f32(), state_->stream), "swiglu");
}

void CudaBackend::softmax_rows(const Tensor& x) {
  const OpProfile::Scope timed(profile_.get(), "softmax_rows");
  check_shape(is_f32(x), "softmax_rows needs F32");
  check_cuda(xpack::rt::softmax_rows(x.f32(), x.width(), x.rows(), state_->stream), "softmax_rows");
}

void CudaBackend::top_k(const Tensor& scores, const Tensor& ids) {
  const OpProfile::Scope timed(profile_.get(), "top_k");
  const int64_t n = scores.width(), k = ids.width();
  check_shape(is_f32(scores) && ids.type == XPACK_TYPE_I32 && ids.rows() == scores.rows() && k <= n,
              "top_k shapes disagree");
  check_cuda(xpack::rt::top_k(scores.f32(), n, scores.rows(), k, ids.i32(), state_->stream), "top_k");
}

void CudaBackend::take(const Tensor& values, const Tensor& ids, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "take");
  check_shape(is_f32(values) && ids.type == XPACK_TYPE_I32 && is_f32(out) && same_shape(ids, out) &&
                  ids.rows() == values.rows(),
              "take shapes disagree");
  check_cuda(xpack::rt::take(values.f32(), values.width(), ids.i32(), ids.width(), ids.rows(), out.f32(), state_->stream),
             "take");
}

void CudaBackend::normalize_rows(const Tensor& x, float floor) {
  const OpProfile::Scope timed(profile_.get(), "normalize_rows");
  check_shape(is_f32(x), "normalize_rows needs F32");
  check_cuda(xpack::rt::normalize_rows(x.f32(), x.width(), x.rows(), floor, state_->stream), "normalize_rows");
}

void CudaBackend::route(const Tensor& logits, const RouteSpec& spec, const Tensor& ids, const Tensor& weights) {
  const int64_t n = logits.width(), k = ids.width();
  if (n > xpack::rt::route_max_experts()) {  // beyond one block's shared memory: the chain op by op
    Backend::route(logits, spec, ids, weights);
    return;
  }
  const OpProfile::Scope timed(profile_.get(), "route");
  check_shape(is_f32(logits) && ids.type == XPACK_TYPE_I32 && is_f32(weights) && same_shape(ids, weights) &&
                  ids.rows() == logits.rows() && k <= n,
              "route shapes disagree");
  check_shape(!spec.bias || (is_f32(*spec.bias) && spec.bias->numel() == n), "route: the bias is not one F32 row");
  const int gate = !spec.gate ? -1 : *spec.gate == Unary::sigmoid ? 0 : 1;
  check_cuda(xpack::rt::route(logits.f32(), n, logits.rows(), gate, spec.bias ? spec.bias->f32() : nullptr, spec.select,
                              k, spec.normalize, spec.floor, spec.scale, ids.i32(), weights.f32(), state_->stream),
             "route");
}

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_head_kv,
                            int64_t pos0, float scale, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "attention");
  check_shape(n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0 && q.width() % n_head == 0,
              "attention head counts disagree");
  const int64_t D = q.width() / n_head, kv_w = n_head_kv * D, n = q.rows();
  check_shape(is_f32(q) && is_f32(k) && is_f32(v) && is_f32(out) && same_shape(q, out) && same_shape(k, v) &&
                  k.width() == kv_w && k.rows() == pos0 + n,
              "attention shapes disagree");
  Tensor scratch;
  if (k.rows() > xpack::rt::attention_smem_positions()) scratch = raw_alloc(XPACK_TYPE_F32, k.rows(), n * n_head);
  check_cuda(xpack::rt::attention(q.f32(), k.f32(), v.f32(), n, n_head, n_head_kv, D, pos0, scale, out.f32(),
                                  scratch.data ? scratch.f32() : nullptr, state_->stream),
             "attention");
}

void CudaBackend::combine_picks(const Tensor& ys, const Tensor& rows, const Tensor& weights, int64_t k,
                                bool accumulate, const Tensor& out) {
  const OpProfile::Scope timed(profile_.get(), "combine_picks");
  const int64_t d = out.width(), n = out.rows();
  // The rows themselves are the dispatcher's own (never read back to check here).
  check_shape(is_f32(ys) && is_f32(out) && ys.width() == d && rows.type == XPACK_TYPE_I32 && rows.numel() == n * k &&
                  is_f32(weights) && weights.numel() == n * k && k > 0,
              "combine_picks shapes disagree");
  check_cuda(xpack::rt::combine_picks(ys.f32(), d, rows.i32(), weights.f32(), k, n, accumulate, out.f32(),
                                      state_->stream),
             "combine_picks");
}

void CudaBackend::enable_profile() {
  if (!profile_) profile_ = std::make_unique<OpProfile>(state_->stream);
}

// ---- device_backend.h ----

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o) {
  auto be = std::make_unique<CudaBackend>(0, o.workspace_bytes);
  be->set_graphs(o.graphs);
  xk::dev::set_mma_large_from(o.mma_large_from);
  if (o.no_dp4a)  // the defaults of every other setting, dp4a off
    xk::dev::set_matvec_geometry(0, true, 0, true, xk::dev::kMmaDecodeAuto, 0, 0, false);
  return be;
}

void cuda_fit_workspace(Backend& be) {
  if (auto* cb = dynamic_cast<CudaBackend*>(&be)) cb->fit_workspace();
}

std::string cuda_vram_plan(Backend& be, uint64_t expert_cache_bytes) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) return "";
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  const auto mib = [](uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / 1048576.0);
    return std::string(buf);
  };
  return "VRAM plan (cuda:" + std::to_string(cb->ordinal()) + "): trunk " + mib(cb->weight_bytes()) +
         ", KV/state and norms " + mib(cb->tensor_bytes()) + " at load (KV caches grow with the sequence)" +
         ", workspace " + mib(cb->workspace_bytes()) + ", expert cache " + mib(expert_cache_bytes) + "; free " +
         mib(free_b) + " of " + mib(total_b);
}

CudaGraphCounts cuda_graph_counts(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  return cb ? cb->graph_counts() : CudaGraphCounts{};
}

double cuda_host_wait_s(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  return cb ? cb->host_wait_s() : 0.0;
}

void cuda_profile_section(Backend& be, const std::string& name) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) return;
  cb->enable_profile();
  cb->profile()->section(name);
}

std::string cuda_profile_report(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  return cb && cb->profile() ? cb->profile()->report() : "";
}

}  // namespace xrun
