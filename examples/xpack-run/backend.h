// The compute backend a model is built on (one object, handed to the model; the
// CPU implementation is cpu_backend.h). It owns the compute stream, the memory
// tensors live in and the named operations every graph is written with, so a
// graph is written once and runs on any backend.
//
// Ordering: operations are enqueued on the backend's one compute stream and run
// in order; they may return before their results exist (a GPU backend), so the
// host never reads a tensor's bytes directly: download() is the one way back,
// and it waits for the work enqueued before it. On the CPU backend every
// operation has finished when it returns.
//
// Memory: a tensor's bytes live while a handle to them does; a device backend
// frees in stream order (e.g. cudaFreeAsync), so a graph may drop a temporary
// as soon as the operations that use it are enqueued. upload() has copied the
// host bytes when it returns.
//
// Shapes: activations are [rows][width] (Tensor::width() contiguous); ops check
// that shapes agree and throw ModelError if not. Outputs are written through the
// handle given; unless an op says otherwise an output may not overlap an input.
//
// Operations one architecture alone uses are not here: they are declared in
// that model's folder (models/deepseek4/ds4_ops.h, models/kimi_k3/kimi_ops.h),
// one implementation per backend beside the CPU one.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "rope_yarn.h"
#include "tensor.h"
#include "weights.h"

namespace xrun {

// Rotary position embedding of whole heads: in each head_dim-wide head the
// first (or, with `tail`, the last) angles.n_dims values are rotated in
// adjacent pairs, ggml's "normal" mode, with rope_ext's YaRN arithmetic.
struct RopeSpec {
  RopeYarn angles;
  int64_t head_dim = 0;
  bool tail = false;
};

// Elementwise functions of Backend::unary.
enum class Unary {
  sigmoid,       // 1 / (1 + e^-x)
  sqrt_softplus  // sqrt(log(1 + e^x)), log1p form; x above 20 taken as is
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory ----
  // A new zero-filled [rows][width] tensor of `type` (either may be 0).
  virtual Tensor alloc(uint32_t type, int64_t width, int64_t rows = 1) = 0;
  // A new [rows][width] tensor whose bytes are unspecified until an operation
  // writes them: for an output that the next operation writes whole. A device
  // backend skips alloc's zero fill (a launch per temporary, about a sixth of
  // a deepseek4 decode step's launches); the CPU's is alloc.
  virtual Tensor empty(uint32_t type, int64_t width, int64_t rows = 1) { return alloc(type, width, rows); }
  // A trunk weight in its GGUF block format, kept for the backend's life (a
  // GPU backend uploads it once; the CPU backend views the mapping). 3-D and
  // 4-D tensors come back as [rows()][ne0].
  virtual Tensor weight(const WeightTensor& w) = 0;
  // A new tensor holding `rows` rows of `width` host values of `type`.
  virtual Tensor upload(uint32_t type, const void* host, int64_t width, int64_t rows = 1) = 0;
  // Copies src's bytes to host memory once the work before it is done: the
  // only way results reach the host.
  virtual void download(const Tensor& src, void* host) = 0;
  // download() in two halves, so that work enqueued between them (a MoE layer's
  // shared expert, behind its router's ids) runs while the host waits:
  // start_download orders the copy of src after the work enqueued so far, and
  // finish_download waits for that copy alone and writes its bytes to host
  // (src's size): src as it was at the start. One at a time; a start drops an
  // unfinished one. The default downloads at the start: no overlap.
  virtual void start_download(const Tensor& src);
  virtual void finish_download(void* host);
  // dst = src (same type and element count).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;

  // ---- stream ----
  // The native compute stream (cudaStream_t) that expert memory is released
  // on, or nullptr where operations finish before they return (the CPU).
  virtual void* stream() = 0;
  // Work enqueued from now on waits for `event` (cudaEvent_t), without
  // blocking the host. nullptr: nothing to wait for.
  virtual void wait_event(void* event) = 0;
  // The work enqueued from here to the next download() is the stretch of an
  // n-token step up to its next host round trip (a router's ids, the
  // logits); `step_start`: the step's first stretch. A GPU backend may record
  // the stretch and launch it as one CUDA graph, updated and replayed at the
  // same place of later steps, instead of launching its kernels one by one
  // (a few microseconds of host time each). The caller promises that no other
  // stream waits on work of the stretch: an expert cache's release does, so
  // call this once a layer's expert request is done. The CPU's: nothing.
  virtual void capture_until_download(int64_t tokens, bool step_start) {
    (void)tokens;
    (void)step_start;
  }

  // ---- operations ----
  // y[t][o] = sum_i w[o][i] * x[t][i]: w [ne1][ne0] in any GGUF type, x [n][ne0], y [n][ne1] (F32).
  virtual void matmul(const Tensor& w, const Tensor& x, const Tensor& y) = 0;
  // Several experts' products in one call (a GPU backend: one launch for all
  // decode-sized problems): problem p writes rows [row, row + rows) of y from
  // the same rows of x with its w. Every w has one type and shape, rows of
  // different problems do not overlap, and each problem's rows equal
  // matmul(w, those x rows) alone, bit for bit, whatever else is in the call.
  struct GroupedProblem {
    Tensor w;
    int64_t row = 0, rows = 0;
  };
  virtual void grouped_matmul(const std::vector<GroupedProblem>& problems, const Tensor& x, const Tensor& y);
  // The products one input feeds (a layer's projections of its normed input):
  // *p.y = *p.w x for each p (a GPU backend: one launch per weight type where x
  // is decode-sized). Each y equals matmul(*p.w, x, *p.y) alone, bit for bit;
  // no y may overlap x or another y.
  struct Product {
    const Tensor* w;
    const Tensor* y;
  };
  virtual void shared_input_matmul(const Tensor& x, const std::vector<Product>& products);
  // out[r] = table[ids[r]]: table any GGUF type, ids I32 [n], out [n][table
  // width], F32 (dequantized), or I32 from an I32 table.
  virtual void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // dst[ids[r]] = src[r] (F32 rows of one width).
  virtual void set_rows(const Tensor& src, const Tensor& ids, const Tensor& dst) = 0;
  // Per row: y = x / sqrt(mean(x^2) + eps) (squares summed in double) * weight
  // (weight: one F32 row, or nullptr). y may be x.
  virtual void rms_norm(const Tensor& x, const Tensor* weight, float eps, const Tensor& y) = 0;
  // out = a + b; b has a's shape or is one row added to every row. out may be a.
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = a * b elementwise (same shapes). out may be a.
  virtual void mul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // Per row: y = x / max(||x||, eps) (squares summed in double). y may be x.
  virtual void l2_norm(const Tensor& x, float eps, const Tensor& y) = 0;
  // out = x * s. out may be x.
  virtual void scale(const Tensor& x, float s, const Tensor& out) = 0;
  // out = f(x) elementwise. out may be x.
  virtual void unary(Unary f, const Tensor& x, const Tensor& out) = 0;
  // In place: every head of row t of x rotated at position pos0 + t * pos_step
  // (by the inverse rotation with `inverse`).
  virtual void rope(const Tensor& x, const RopeSpec& spec, int64_t pos0, int64_t pos_step = 1,
                    bool inverse = false) = 0;
  // In place: every spec.head_dim-wide head of x normed as rms_norm does
  // (weight: one head's width of F32, or nullptr), then rope(x, spec, pos0)
  // (a GPU backend: one launch where the two are two).
  virtual void rms_norm_rope(const Tensor& x, const Tensor* weight, float eps, const RopeSpec& spec, int64_t pos0);
  // out = silu(min(gate, limit)) * clamp(up, -limit, limit); limit <= 1e-6: no
  // clamp (plain SwiGLU). out may be gate.
  virtual void swiglu(const Tensor& gate, const Tensor& up, float limit, const Tensor& out) = 0;
  // In place, per row: exp(x - max) / sum (sum in double).
  virtual void softmax_rows(const Tensor& x) = 0;
  // ids [n][k] (I32): per row the k largest values of scores, largest first, ties to the lower index.
  virtual void top_k(const Tensor& scores, const Tensor& ids) = 0;
  // out[r][j] = values[r][ids[r][j]].
  virtual void take(const Tensor& values, const Tensor& ids, const Tensor& out) = 0;
  // In place, per row: x /= max(sum(x) (in double, left to right, then rounded to float), floor).
  virtual void normalize_rows(const Tensor& x, float floor) = 0;
  // A router's selection after its product, as one operation (a GPU backend:
  // one launch for a chain of up to six): in place, logits = gate(logits)
  // (no gate: left as they are); with `select`, ids = top_k(logits + bias)
  // (bias: one F32 row, or none), else ids as given (hash routing); weights =
  // the (gated) logits at ids, then normalize_rows(floor) when `normalize`,
  // then times `scale` unless it is 0 or 1. Bit for bit those operations in
  // turn, which is what this default does.
  struct RouteSpec {
    std::optional<Unary> gate;
    const Tensor* bias = nullptr;
    bool select = true;
    bool normalize = false;
    float floor = 0.0f;
    float scale = 1.0f;
  };
  virtual void route(const Tensor& logits, const RouteSpec& spec, const Tensor& ids, const Tensor& weights);
  // Causal grouped-query attention: q [n][n_head * D] at positions pos0 + t,
  // k and v [pos0 + n][n_head_kv * D] (every position so far), query head h
  // reading key head h / (n_head / n_head_kv); softmax(scale * q.k) . v into out [n][n_head * D].
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_head_kv,
                         int64_t pos0, float scale, const Tensor& out) = 0;

  // ---- routed experts (the dispatcher's gather / scatter) ----
  // out[t] = ys[rows[t*k]] * weights[t*k] + ... + ys[rows[t*k+k-1]] * weights[t*k+k-1],
  // each product rounded, added in rank order; with `accumulate`, that sum +
  // out[t]. rows I32 [n * k]: the row of ys (F32 [m][d]) computed for each
  // (token, rank) pair t * k + j of a routing; weights F32 [n * k] (any shape).
  virtual void combine_picks(const Tensor& ys, const Tensor& rows, const Tensor& weights, int64_t k, bool accumulate,
                             const Tensor& out) = 0;

 private:
  // The default halves: start_download's bytes until finish_download.
  std::vector<uint8_t> started_bytes_;
  bool download_started_ = false;
};

// Grows `t` ([rows][width]) to hold at least `rows` rows, keeping its
// contents; capacity doubles so that appending one row at a time stays cheap.
void reserve_rows(Backend& be, Tensor& t, int64_t rows);

// A trunk weight dequantized to F32 on the backend: norms, biases and other
// small vectors the operations take as floats.
Tensor float_weight(Backend& be, const WeightTensor& w);

}  // namespace xrun
