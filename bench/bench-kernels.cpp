// Kernel benchmark (GPU machine): microseconds per product and weight bytes per
// second of the cuda/quant_matmul.h kernels, for every weight type at the model
// shapes, against a device-to-device cudaMemcpy measured in the same run.
//
//   bench-kernels [--quick] [--few-rows] [--decode] [--block-threads N] [--wave-per-problem]
//                 [--row-threads N] [--no-pipeline] [--[no-]mma-decode] [--mma-warps N] [--mma-tiles N]
//                 [--mma-large-from N] [--mma-two-products] [--no-dp4a] [--[no-]prestage] [--type T,...]
//                 [--shape S] (one RESULT line per measurement)
//   --few-rows: the copy and the few-row matrices only (a short device call)
//   --decode: the copy, matvec and the grouped decode launches only (no prefill)
//   --block-threads, --wave-per-problem, --row-threads, --no-pipeline, --mma-*: the decode
//     kernel's layout (--mma-decode: MXFP4 on the int8 tensor cores instead of the FMA kernel;
//     doc/kernels.md), to measure one against another in the same call
//   --mma-large-from N: the prefill kernel's 128 x 64 tiles from N tokens whatever the grid
//     (default: a rule of tokens and grid, cuda/quant_mma.cu; a large N: never), likewise
//   --no-dp4a: the K-quants' and MXFP4's decode on the FMA units for every row (default: rows whose
//     x fits shared memory as int8 terms on the dp4a units, cuda/matvec_units.cuh)
//   --mma-two-products: MXFP4 on the tensor cores from two tokens on takes two int8 products a
//     block and pair of tokens, as at one token (default: one; cuda/mxfp4_mmv.cu; the same bits)
//   --no-prestage: each block of a dp4a or tensor-core launch makes x's int8 terms itself;
//     --prestage: one launch before the product makes them once in the context's workspace
//     for every launch (default: where that was measured faster, cuda/quant_matvec.cu and
//     cuda/mxfp4_mmv.cu; the same bits)
//   --type, --shape: only the shapes of those types / of that name (e.g. for ncu)
//
// kind=matvec and kind=grouped are the decode kernel through matmul()'s context, as
// xpack-run runs it (before 2026-12-05: matvec() and grouped_matvec(), which have
// no workspace; the same kernels at these shapes but for the dp4a units' terms,
// made once per launch only with a workspace); in --few-rows, kind=matvec is
// matvec() and kind=matvec-split the same product through the context, which
// splits the rows of a matrix too short to fill the GPU (doc/kernels.md, "Few rows").
//
// hot:  the same weights every repetition (what llama.cpp's test-backend-ops perf
//       measures: matrices under the 60 MB L2 may be served partly from it);
// cold: a rotating set of copies of the weights, together >= 8x the L2, so every
//       product reads its weights from HBM.
// Weights are random blocks (random quant bytes, sane fp16 scales): the speed
// does not depend on the values, but zeros are never timed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cli_app.h"
#include "quant_matmul.h"
#include "quant_mma.h"

namespace xk = xpack::kernels;

namespace {

void die(const char* what, cudaError_t e) {
  std::fprintf(stderr, "bench-kernels: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
#define CK(call)                               \
  do {                                         \
    const cudaError_t e_ = (call);             \
    if (e_ != cudaSuccess) die(#call, e_);     \
  } while (0)
void st_ok(int st, const char* what) {
  if (st != xk::kOk) {
    std::fprintf(stderr, "bench-kernels: %s: %s\n", what, xk::status_name(st));
    std::exit(1);
  }
}


uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t next() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
uint16_t rand_f16() { return uint16_t(((next() & 1) << 15) | ((3 + next() % 9) << 10) | (next() & 0x3FF)); }
void put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }

std::vector<uint8_t> random_weights(uint32_t type, size_t bytes) {
  std::vector<uint8_t> w(bytes);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = next();
    std::memcpy(&w[i], &v, 8);
  }
  const size_t bb = size_t(xk::block_bytes(type));
  for (size_t i = 0; i + bb <= bytes; i += bb) {
    uint8_t* b = &w[i];
    switch (type) {
      case xk::kF32: { const float v = float(int(next() % 2001) - 1000) / 1000.0f; std::memcpy(b, &v, 4); break; }
      case xk::kF16: put16(b, rand_f16()); break;
      case xk::kBF16: put16(b, uint16_t(((next() & 1) << 15) | ((117 + next() % 12) << 7) | (next() & 0x7F))); break;
      case xk::kQ8_0: put16(b, rand_f16()); break;
      case xk::kQ2_K: put16(b + 80, rand_f16()); put16(b + 82, rand_f16()); break;
      case xk::kQ3_K: put16(b + 108, rand_f16()); break;
      case xk::kQ4_K: case xk::kQ5_K: put16(b, rand_f16()); put16(b + 2, rand_f16()); break;
      case xk::kQ6_K: put16(b + 208, rand_f16()); break;
      case xk::kMXFP4: b[0] = uint8_t(118 + next() % 21); break;
      default: break;
    }
  }
  return w;
}

// Enough copies of one random matrix (at least two) that cycling through them
// reads cold_bytes, so the "cold" rows find no weight in L2.
std::vector<void*> weight_copies(uint32_t type, size_t wb, size_t cold_bytes) {
  std::vector<void*> w(std::max<size_t>(2, (cold_bytes + wb - 1) / wb));
  const auto host = random_weights(type, wb);
  for (auto& p : w) {
    CK(cudaMalloc(&p, wb));
    CK(cudaMemcpy(p, host.data(), wb, cudaMemcpyHostToDevice));
  }
  return w;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
  ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
};

// --graph: the calls are recorded once into a CUDA graph and replayed, as
// xpack-run's decode replays its steps. Launched one by one from the host, a
// product shorter than the host's launch time may measure the host: on the H100 of
// 2026-12-06 one MXFP4 expert (4.4 MB) took 8.8 us alone and 3.6 us as one of six
// in a grouped launch.
bool g_graph = false;

// Median over `trials` of the mean time of `reps` back-to-back calls of fn(i), in us.
template <class F>
double time_us(cudaStream_t s, int reps, int trials, F&& fn) {
  Timer t;
  // Warm-up, and outside any capture: a context grows its workspace on first use.
  for (int i = 0; i < 3; ++i) fn(i);
  CK(cudaStreamSynchronize(s));
  cudaGraphExec_t exec = nullptr;
  if (g_graph) {
    cudaGraph_t g = nullptr;
    // Relaxed, as xpack-run records its decode steps (cuda_backend.cpp).
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < reps; ++i) fn(i);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaGraphLaunch(exec, s));  // the first replay uploads the graph: not timed
    CK(cudaStreamSynchronize(s));
  }
  std::vector<double> v;
  for (int k = 0; k < trials; ++k) {
    CK(cudaEventRecord(t.a, s));
    if (exec) {
      CK(cudaGraphLaunch(exec, s));
    } else {
      for (int i = 0; i < reps; ++i) fn(i);
    }
    CK(cudaEventRecord(t.b, s));
    CK(cudaEventSynchronize(t.b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    v.push_back(double(ms) * 1000.0 / reps);
  }
  if (exec) CK(cudaGraphExecDestroy(exec));
  CK(cudaGetLastError());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  uint32_t type;
  int64_t ne0, ne1;
  const char* what;
};

// The items of a comma-separated list ("" names none; "a,,b" has an empty one).
std::vector<std::string> comma_items(const std::string& list) {
  std::vector<std::string> items;
  for (size_t pos = 0; !list.empty() && pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    items.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

double g_copy_gbs = 0;
size_t g_l2 = 0;

void report(const char* kind, uint32_t type, int64_t ne0, int64_t ne1, int n, const char* mode,
            double us, double bytes, const char* what) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("RESULT kind=%s type=%s m=%lld n=%d k=%lld mode=%s us=%.2f weight_GBps=%.0f copy_pct=%.1f shape=%s\n",
              kind, xk::type_name(type), (long long)ne1, n, (long long)ne0, mode, us, gbs,
              100.0 * gbs / g_copy_gbs, what);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, few_only = false, decode_only = false, wave_per_problem = false, no_pipeline = false,
       mma_decode = false, no_mma_decode = false, no_dp4a = false, no_prestage = false, prestage_always = false,
       two_products = false, group_barrier = false, q3k_wide = false, no_q3k_wide = false, mma_slices = false, no_mma_slices = false, kq_mma = false, kq_decode = false, no_kq_decode = false;
  uint64_t block_threads = 0, row_threads = 0, mma_warps = 0, mma_tiles = 0, large_from = 0, f32_variant = 0,
           kq_split = 0;
  std::string only_type, only_shape, token_list;
  xpack::cli::App app("bench-kernels",
                      "bench-kernels [--quick] [--graph] [--few-rows] [--decode] [--block-threads N] [--wave-per-problem] "
                      "[--row-threads N] [--no-pipeline] [--[no-]mma-decode] [--mma-warps N] [--mma-tiles N] "
                      "[--mma-large-from N] [--mma-two-products] [--[no-]mma-slices] [--f32-variant N] [--group-barrier] [--[no-]q3k-wide-loads] "
                      "[--kq-mma] [--[no-]kq-mma-decode] [--kq-split N] "
                      "[--no-dp4a] [--[no-]prestage] [--tokens N,...] [--type T,...] [--shape S]",
                      "Microseconds per product and weight GB/s of the CUDA kernels (cuda/quant_matmul.h) for "
                      "every weight type, against a device-to-device copy measured in the same run; one RESULT "
                      "line per measurement.",
                      "doc/benchmarks.md (\"Compute kernels\") has the results and how they were run.");
  app.flag("--quick", &quick, "fewer repetitions (a short device call)");
  app.flag("--graph", &g_graph,
           "each measurement's calls recorded once into a CUDA graph and replayed, without the host's launch "
           "time between them (as xpack-run's decode replays them; default: launched one by one from the "
           "host, as bench/llama-kernels.sh runs llama.cpp's test-backend-ops)");
  app.flag("--few-rows", &few_only, "the copy and the few-row matrices only");
  app.flag("--decode", &decode_only, "the copy, matvec and the grouped decode launches only (no prefill)");
  app.count("--block-threads", "N", &block_threads,
            "threads per block of the decode kernel where x is staged in shared memory: 256 or 512 (default: "
            "chosen per launch)", 256, 512);
  app.flag("--wave-per-problem", &wave_per_problem,
           "each problem of a grouped decode launch gets a wave of blocks (the earlier layout; default: one "
           "wave shared by the launch)");
  app.count("--row-threads", "N", &row_threads,
            "at most N threads share a group of rows in the decode kernel: 32, 64 or 128 (128: the layout "
            "before 2026-12-03); 256: rows of 256 units and more take a whole block each, the rows in flight "
            "half the bytes (default: a rule per weight type and row length)", 32, 256);
  app.flag("--no-pipeline", &no_pipeline,
           "MXFP4's decode kernel loads each unit just before its products (the layout before 2026-12-03; "
           "default: a unit ahead, while the one before is computed)");
  app.flag("--mma-decode", &mma_decode,
           "MXFP4 decode on the int8 tensor cores (cuda/mxfp4_mmv.cu) for every shape of whole 512-input groups "
           "(default: where a rule of the shape and token count takes it, doc/kernels.md)");
  app.flag("--no-mma-decode", &no_mma_decode, "MXFP4 decode on the FMA kernel for every shape");
  app.count("--mma-warps", "N", &mma_warps,
            "the tensor-core kernel's warps sharing a tile of 16 rows, 4, 8 or 16 (default: each problem's by its "
            "shape and token count, 4 x 4 or 16 x 1)",
            4, 16);
  app.count("--mma-tiles", "N", &mma_tiles,
            "the tensor-core kernel's tiles of 16 rows a block of threads, 1, 2 or 4 (default: as --mma-warps'; 8 "
            "warps take 2, 16 take 1)",
            1, 4);
  app.count("--mma-large-from", "N", &large_from,
            "the prefill kernel's 128 x 64 tiles from N tokens whatever the grid (default: a rule of tokens and "
            "grid, cuda/quant_mma.cu; a large N: never)", 1, 1u << 30);
  CLI::Option* f32_opt =
      app.count("--f32-variant", "N", &f32_variant,
                "F32 decode's unit for every token count: 0 (8 floats, two plain loads a row), 1 (the same through "
                "the read-only path), 2 (4 floats, one read-only load a row); default: 2 at one token, 0 above",
                0, 2);
  app.flag("--group-barrier", &group_barrier,
           "the decode kernel's groups of rows of several warps wait on a barrier of their own between the "
           "rounds of their sum (default: on the whole block's; the same bits)");
  app.flag("--q3k-wide-loads", &q3k_wide,
           "Q3_K's dp4a decode loads each half block's high bits and quants as three 16-byte windows instead of "
           "nine 4-byte words each, for every matrix (default: matrices larger than the L2 and a lone product at "
           "one token; the same bits)");
  app.flag("--no-q3k-wide-loads", &no_q3k_wide, "Q3_K's dp4a decode loads 4-byte words for every matrix");
  app.flag("--mma-slices", &mma_slices,
           "MXFP4's tensor-core decode runs sliced wherever a context's scratch holds it, one token included "
           "(the same bits)");
  app.flag("--no-mma-slices", &no_mma_slices,
           "MXFP4's tensor-core decode never runs sliced (default: from two tokens on, rows of 7168+ inputs or "
           "several problems, where a context's scratch holds it; the same bits)");
  app.flag("--kq-mma", &kq_mma,
           "also rows kind=kq-mma: Q2_K's and Q3_K's decode kernel on the int8 tensor cores alone "
           "(kquant_mmv.cu, whatever --kq-mma-decode says), at the decode rows' token counts");
  app.flag("--kq-mma-decode", &kq_decode,
           "Q2_K's and Q3_K's decode (matvec and grouped rows) on the int8 tensor cores at every token count "
           "(kquant_mmv.cu; default: by the rule, from four tokens on and from two where the matrix fits the L2)");
  app.flag("--no-kq-mma-decode", &no_kq_decode,
           "Q2_K's and Q3_K's decode on the dp4a units at every token count (default: the rule above)");
  app.count("--kq-split", "N", &kq_split,
            "with --kq-mma: at most N warps split a tile's row (default 16; the bits may differ)", 1, 16);
  app.flag("--no-dp4a", &no_dp4a,
           "the K-quants' and MXFP4's decode on the FMA units for every row (default: rows whose x fits shared memory "
           "as int8 terms on the dp4a units, doc/kernels.md)");
  app.flag("--mma-two-products", &two_products,
           "MXFP4 on the tensor cores from two tokens on: two int8 products a block and pair of tokens, as at one "
           "token (default: one; the same bits)");
  app.flag("--no-prestage", &no_prestage,
           "each block of a dp4a or tensor-core launch turns x into int8 terms itself (default: where it was measured "
           "faster, one launch before the product makes them for all its blocks; the same bits)");
  app.flag("--prestage", &prestage_always,
           "every dp4a or tensor-core launch with a workspace makes x's int8 terms once for all its blocks (the same "
           "bits)");
  app.text("--tokens", "N,...", &token_list,
           "the decode kernel at these token counts, 1 to 8 (default 1,8), and the prefill path's tensor-core "
           "tiles at those above 1 (default 2,8): where matvec_max_tokens should sit");
  app.text("--type", "T,...", &only_type, "only the shapes of these weight types (ggml's names: mxfp4,q2_K,...)");
  app.text("--shape", "S", &only_shape,
           "only the shapes of this name (as printed in shape=); probe-f32-in14336-rows37449 and "
           "probe-f32-in16384-rows16384 run only when named");
  if (auto rc = app.parse(argc, argv)) return *rc;
  if (block_threads != 0 && block_threads != 256 && block_threads != 512)
    return app.usage_error("--block-threads: 256 or 512");
  if (row_threads != 0 && row_threads != 32 && row_threads != 64 && row_threads != 128 && row_threads != 256)
    return app.usage_error("--row-threads: 32, 64, 128 or 256");
  if ((mma_warps != 0 && mma_warps != 4 && mma_warps != 8 && mma_warps != 16) ||
      (mma_tiles != 0 && mma_tiles != 1 && mma_tiles != 2 && mma_tiles != 4))
    return app.usage_error("--mma-warps: 4, 8 or 16; --mma-tiles: 1, 2 or 4");
  if (mma_warps == 8 && mma_tiles == 4) return app.usage_error("--mma-warps 8 takes --mma-tiles 2 (512 threads a block)");
  if ((mma_warps == 16 && mma_tiles > 1) || (mma_tiles == 1 && mma_warps != 16))
    return app.usage_error("--mma-warps 16 takes --mma-tiles 1 (512 threads a block), and one tile 16 warps");
  if (mma_decode && no_mma_decode) return app.usage_error("--mma-decode or --no-mma-decode, not both");
  if (no_prestage && prestage_always) return app.usage_error("--prestage or --no-prestage, not both");
  if ((mma_warps != 0 || mma_tiles != 0) && no_mma_decode)
    return app.usage_error("--mma-warps/--mma-tiles lay out the tensor-core kernel, which --no-mma-decode turns off");
  xk::dev::set_matvec_geometry(int(block_threads), !wave_per_problem, int(row_threads), !no_pipeline,
                               mma_decode      ? xk::dev::kMmaDecodeAlways
                               : no_mma_decode ? xk::dev::kMmaDecodeNever
                                               : xk::dev::kMmaDecodeAuto,
                               int(mma_warps), int(mma_tiles), !no_dp4a,
                               no_prestage       ? xk::dev::kPrestageNever
                               : prestage_always ? xk::dev::kPrestageAlways
                                                 : xk::dev::kPrestageAuto,
                               !two_products);
  xk::dev::set_mma_large_from(int(large_from));
  xk::dev::set_f32_variant(f32_opt->count() > 0 ? int(f32_variant) : -1);
  xk::dev::set_group_barrier(group_barrier);
  if (q3k_wide && no_q3k_wide) return app.usage_error("--q3k-wide-loads or --no-q3k-wide-loads, not both");
  xk::dev::set_q3k_wide_loads(q3k_wide      ? xk::dev::kSwitchOn
                              : no_q3k_wide ? xk::dev::kSwitchOff
                                            : xk::dev::kSwitchAuto);
  xk::dev::set_kq_mmv_split(int(kq_split));
  if (mma_slices && no_mma_slices) return app.usage_error("--mma-slices or --no-mma-slices, not both");
  xk::dev::set_mma_slices(mma_slices      ? xk::dev::kSwitchOn
                          : no_mma_slices ? xk::dev::kSwitchOff
                                          : xk::dev::kSwitchAuto);
  if (kq_decode && no_kq_decode) return app.usage_error("--kq-mma-decode or --no-kq-mma-decode, not both");
  xk::dev::set_kq_mma(kq_decode      ? xk::dev::kMmaDecodeAlways
                      : no_kq_decode ? xk::dev::kMmaDecodeNever
                                     : xk::dev::kMmaDecodeAuto);
  const uint32_t all[] = {xk::kF32, xk::kF16, xk::kBF16, xk::kQ8_0, xk::kQ4_K,
                          xk::kQ5_K, xk::kQ6_K, xk::kQ2_K, xk::kQ3_K, xk::kMXFP4};
  std::vector<Shape> shapes = {
      {xk::kMXFP4, 4096, 2048, "ds4-expert-gate-up"},
      {xk::kMXFP4, 2048, 4096, "ds4-expert-down"},
      {xk::kQ2_K, 3584, 3072, "kimi-expert-gate-up"},
      {xk::kQ3_K, 3072, 3584, "kimi-expert-down"},
  };
  for (uint32_t t : all) shapes.push_back({t, 14336, 4096, "4096x14336"});
  // Several times the 60 MB L2 for every type (Q2_K 176 MB, MXFP4 285 MB, F32 2.1 GB):
  // decode only (the prefill rows would add minutes and nothing the shape above lacks).
  for (uint32_t t : all) shapes.push_back({t, 16384, 32768, "large-16384x32768"});
  // Kimi-K3's MXFP4 trunk at one token (xpack-synth --preset kimi-k3): most of its
  // decode step (doc/benchmarks.md). Decode only, as the large shape.
  shapes.push_back({xk::kMXFP4, 7168, 12288, "large-kimi-kda-7168x12288"});
  shapes.push_back({xk::kMXFP4, 12288, 7168, "large-kimi-kda-out-12288x7168"});
  shapes.push_back({xk::kMXFP4, 7168, 33792, "large-kimi-dense-7168x33792"});
  shapes.push_back({xk::kMXFP4, 33792, 7168, "large-kimi-dense-down-33792x7168"});
  shapes.push_back({xk::kMXFP4, 7168, 163840, "large-kimi-head-7168x163840"});
  shapes.push_back({xk::kMXFP4, 3584, 7168, "large-kimi-routed-up-3584x7168"});
  shapes.push_back({xk::kMXFP4, 6144, 7168, "large-kimi-shexp-down-6144x7168"});
  // DeepSeek-V4's output head (MXFP4 in the preset), and short rows with many tiles.
  shapes.push_back({xk::kMXFP4, 4096, 129280, "large-ds4-head-4096x129280"});
  shapes.push_back({xk::kMXFP4, 2048, 32768, "large-2048x32768"});
  // F32 above the L2 reads at 57 % of the copy (1.2 GB/ms less than llama.cpp) and
  // at 92 % at 14336 inputs: the same bytes with rows of 14336 inputs (a stride
  // not a power of two), and half of them with rows of 16384 (the same stride),
  // tell its size from its 64 KB stride. Run only when --shape names them.
  const std::vector<Shape> probes = {
      {xk::kF32, 14336, 37449, "probe-f32-in14336-rows37449"},
      {xk::kF32, 16384, 16384, "probe-f32-in16384-rows16384"},
  };
  for (const Shape& sh : probes)
    if (only_shape == sh.what) shapes.push_back(sh);
  // Matrices of few rows at one token (DeepSeek-V4's hyper-connection weights,
  // F32, and every other type at the same shape): matmul() through the context
  // splits each row over more warps; the unsplit kernel (matvec(), which has no
  // workspace) is the baseline in the same run.
  std::vector<Shape> few = {
      {xk::kF32, 16384, 24, "ds4-hc-24rows"},
      {xk::kF32, 16384, 4, "ds4-hc-4rows"},
  };
  for (uint32_t t : all)
    if (t != xk::kF32) few.push_back({t, 16384, 24, "few-rows"});
  std::vector<int> decode_tokens = {1, 8}, mma_tokens = {2, 8};
  if (!token_list.empty()) {
    decode_tokens.clear();
    mma_tokens.clear();
    for (const std::string& item : comma_items(token_list)) {
      const int n = item.size() == 1 && item[0] >= '1' && item[0] <= '8' ? item[0] - '0' : 0;
      if (n == 0) return app.usage_error("--tokens: '" + item + "' is not a token count from 1 to 8");
      decode_tokens.push_back(n);
      if (n > 1) mma_tokens.push_back(n);
    }
  }
  // A filter that names no type or shape is a typo, not an empty benchmark.
  const std::vector<std::string> types = comma_items(only_type);
  for (const std::string& name : types)
    if (std::none_of(std::begin(all), std::end(all), [&](uint32_t t) { return name == xk::type_name(t); }))
      return app.usage_error("--type: unknown weight type '" + name + "' (f32, f16, bf16, q8_0, q4_K, q5_K, "
                             "q6_K, q2_K, q3_K, mxfp4)");
  if (!only_shape.empty() &&
      std::none_of(shapes.begin(), shapes.end(), [&](const Shape& sh) { return only_shape == sh.what; }) &&
      std::none_of(few.begin(), few.end(), [&](const Shape& sh) { return only_shape == sh.what; }))
    return app.usage_error("--shape: no shape is named '" + only_shape + "' (see shape= in the output)");
  if (few_only) shapes.clear();
  if (decode_only) few.clear();
  auto wanted = [&](const Shape& sh) {
    return (types.empty() || std::find(types.begin(), types.end(), xk::type_name(sh.type)) != types.end()) &&
           (only_shape.empty() || only_shape == sh.what);
  };
  shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [&](const Shape& sh) { return !wanted(sh); }), shapes.end());
  few.erase(std::remove_if(few.begin(), few.end(), [&](const Shape& sh) { return !wanted(sh); }), few.end());

  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  g_l2 = size_t(prop.l2CacheSize);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("device: %s, %d SMs, L2 %zu MB\n", prop.name, prop.multiProcessorCount, g_l2 >> 20);
  std::printf("launches: %s\n", g_graph ? "one CUDA graph a measurement, replayed (--graph)" : "one by one from the host");

  // Copy bandwidth: 1 GiB device to device, bytes read + bytes written.
  {
    const size_t n = size_t(1) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 0x5A, n));
    // The reference is the copy as issued from the host, in both modes: replayed
    // from a graph, the same 1 GB copy measured 2451 GB/s against 3030 (H100,
    // 2026-12-06), which made --graph's percentages of it look 24 % better.
    const bool graph = std::exchange(g_graph, false);
    const double us = time_us(s, 10, 5, [&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s)); });
    g_graph = graph;
    g_copy_gbs = 2.0 * double(n) / (us * 1e-6) / 1e9;
    std::printf("RESULT kind=copy bytes=%zu us=%.1f copy_GBps=%.0f\n", n, us, g_copy_gbs);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  xk::Context* ctx = nullptr;
  st_ok(xk::context_create(&ctx, size_t(256) << 20), "context_create");
  const size_t cold_bytes = std::max<size_t>(8 * g_l2, size_t(512) << 20);

  for (const Shape& sh : shapes) {
    const size_t wb = xk::row_bytes(sh.type, sh.ne0) * size_t(sh.ne1);
    const std::vector<void*> w = weight_copies(sh.type, wb, cold_bytes);
    const int copies = int(w.size());
    const int nmax = 512;
    float *x, *y;
    CK(cudaMalloc(reinterpret_cast<void**>(&x), size_t(nmax) * sh.ne0 * 4));
    CK(cudaMalloc(reinterpret_cast<void**>(&y), size_t(nmax) * sh.ne1 * 4));
    {
      std::vector<float> hx(size_t(nmax) * sh.ne0);
      for (auto& v : hx) v = float(int(next() % 2001) - 1000) / 1000.0f;
      CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    // The decode kernel as xpack-run calls it: through the context (whose scratch
    // holds a dp4a launch's terms), at 8 tokens too.
    xk::MatmulOptions dec{};
    dec.size = sizeof dec;
    dec.matvec_max_tokens = 8;
    for (int n : decode_tokens) {
      const int reps = quick ? 50 : 400;
      const double hot = time_us(s, reps, 5, [&](int) {
        st_ok(xk::matmul(ctx, sh.type, w[0], sh.ne0, sh.ne1, x, n, y, &dec, s), "matvec");
      });
      report("matvec", sh.type, sh.ne0, sh.ne1, n, "hot", hot, double(wb), sh.what);
      const double cold = time_us(s, reps, 5, [&](int i) {
        st_ok(xk::matmul(ctx, sh.type, w[size_t(i % copies)], sh.ne0, sh.ne1, x, n, y, &dec, s), "matvec");
      });
      report("matvec", sh.type, sh.ne0, sh.ne1, n, "cold", cold, double(wb), sh.what);
    }
    if (kq_mma && (sh.type == xk::kQ2_K || sh.type == xk::kQ3_K)) {
      const size_t kb = xk::dev::kq_mmv_scratch_bytes(sh.ne0, 8);
      void* ks = nullptr;
      CK(cudaMalloc(&ks, kb));
      for (int n : decode_tokens) {
        const int reps = quick ? 50 : 400;
        for (const bool cold : {false, true}) {
          const double us = time_us(s, reps, 5, [&](int i) {
            st_ok(xk::dev::kq_mmv(sh.type, w[cold ? size_t(i % copies) : 0], sh.ne0, sh.ne1, x, n, y, ks, kb, s),
                  "kq_mmv");
          });
          report("kq-mma", sh.type, sh.ne0, sh.ne1, n, cold ? "cold" : "hot", us, double(wb), sh.what);
        }
      }
      CK(cudaFree(ks));
    }
    const bool prefill = !decode_only && std::string(sh.what).rfind("large", 0) != 0 &&
                         std::string(sh.what).rfind("probe", 0) != 0;
    // 512 tokens: the default fp32 path (tensor cores where the type has them),
    // the fp32 tile path it replaced (for those types), the bf16 option.
    const bool has_mma = sh.type == xk::kMXFP4 || sh.type == xk::kQ8_0 || sh.type == xk::kQ2_K || sh.type == xk::kQ3_K;
    for (int variant : {0, 1, 2}) {
      if (!prefill || (variant == 1 && !has_mma)) continue;
      xk::MatmulOptions o{};
      o.size = sizeof o;
      o.precision = variant == 2 ? int(xk::kPrecisionBf16) : int(xk::kPrecisionFp32);
      o.fp32_tiles = variant == 1;
      const double us = time_us(s, quick ? 3 : 10, 3, [&](int i) {
        st_ok(xk::matmul(ctx, sh.type, w[size_t(i % copies)], sh.ne0, sh.ne1, x, nmax, y, &o, s), "matmul");
      });
      report(variant == 0 ? "matmul-fp32" : variant == 1 ? "matmul-tiles" : "matmul-bf16", sh.type, sh.ne0,
             sh.ne1, nmax, "cold", us, double(wb), sh.what);
      std::printf("  (%.1f TFLOP/s)\n", 2.0 * nmax * double(sh.ne0) * sh.ne1 / (us * 1e-6) / 1e12);
    }
    // 8 tokens through matmul's prefill path instead of the decode kernel (for
    // the types with a tensor-core path: where matvec_max_tokens should sit).
    if (prefill && has_mma) {
      xk::MatmulOptions o{};
      o.size = sizeof o;
      o.matvec_max_tokens = 1;
      for (int n : mma_tokens) {
        const double us = time_us(s, quick ? 20 : 200, 5, [&](int i) {
          st_ok(xk::matmul(ctx, sh.type, w[size_t(i % copies)], sh.ne0, sh.ne1, x, n, y, &o, s), "matmul");
        });
        report("matmul-mma", sh.type, sh.ne0, sh.ne1, n, "cold", us, double(wb), sh.what);
      }
    }
    // A layer's routed experts in a prompt: as many experts as the weight copies
    // allow (<= 128) with `tokens` rows each, in one grouped_matmul (DeepSeek-V4
    // at 512 prompt tokens gives 256 experts 12 rows on average).
    if (prefill && std::string(sh.what).find("expert") != std::string::npos) {
      // Each count as it runs by default and on the fp32 tile path (the baseline);
      // up to 8 tokens also on the decode kernel (variant 2: where matvec_max_tokens
      // should sit for a prompt's experts).
      for (int tokens : {4, 5, 6, 7, 8, 12, 24, 96})
        for (int variant : {0, 1, 2}) {
          if (variant == 2 && tokens > xk::kMaxMatvecTokens) continue;
          if (variant == 1 && tokens > 4 && tokens < 8) continue;  // the baseline's shape is known from 4 and 8
          const int tiles = variant == 1;
          const int np = std::min(copies, std::min(xk::kMaxGroupedProblems, nmax / tokens));
          std::vector<xk::ExpertProblem> pr(static_cast<size_t>(np));
          for (int p = 0; p < np; ++p) pr[size_t(p)] = {w[size_t(p)], p * tokens, tokens};
          xk::MatmulOptions o{};
          o.size = sizeof o;
          o.fp32_tiles = tiles;
          if (variant == 2) o.matvec_max_tokens = xk::kMaxMatvecTokens;
          const double us = time_us(s, quick ? 5 : 20, 5, [&](int) {
            st_ok(xk::grouped_matmul(ctx, sh.type, sh.ne0, sh.ne1, pr.data(), np, x, y, nmax, &o, s), "grouped");
          });
          char mode[32];
          std::snprintf(mode, sizeof mode, "prefill%dx%d", np, tokens);
          const char* kind = variant == 2 ? "grouped-matvec" : tiles ? "grouped-tiles" : "grouped-matmul";
          report(kind, sh.type, sh.ne0, sh.ne1, tokens, mode, us, double(wb) * np, sh.what);
          std::printf("  (%.1f TFLOP/s)\n", 2.0 * np * tokens * double(sh.ne0) * sh.ne1 / (us * 1e-6) / 1e12);
        }
    }
    // The realistic decode: one grouped launch over the top-k experts of a layer
    // (DeepSeek-V4 top-6, Kimi-K3 top-16), one token each, 1 or 8 tokens' worth;
    // and the gate and up of one token's experts in one launch (2 x top-k
    // problems), as xpack-run's decode step runs them (routed_experts.cpp).
    if (std::string(sh.what).find("expert") != std::string::npos) {
      const int topk = sh.type == xk::kMXFP4 ? 6 : 16;
      const bool gate_up = std::string(sh.what).find("gate-up") != std::string::npos;
      const std::vector<int> token_counts = gate_up ? std::vector<int>{1, 2, 8} : std::vector<int>{1, 8};
      // Each twice: the experts rotating through the copies (from HBM, as a decode
      // step's newly routed experts), and the same ones every repetition (hot, as
      // llama.cpp's MUL_MAT_ID perf case times them: 27-176 MB, partly served from the L2).
      for (int tokens : token_counts)
        for (const bool hot : {false, true}) {
          const int np = std::min(topk * tokens, std::min(copies, xk::kMaxGroupedProblems));
          std::vector<xk::ExpertProblem> pr(static_cast<size_t>(np));
          const int rounds = hot ? 1 : std::max(1, copies / np);
          const double us = time_us(s, quick ? 20 : 200, 5, [&](int i) {
            const int base = (i % rounds) * np;
            for (int p = 0; p < np; ++p) pr[size_t(p)] = {w[size_t((base + p) % copies)], p % nmax, 1};
            st_ok(xk::grouped_matmul(ctx, sh.type, sh.ne0, sh.ne1, pr.data(), np, x, y, nmax, &dec, s), "grouped");
          });
          char mode[32];
          std::snprintf(mode, sizeof mode, hot ? "grouped%d-hot" : "grouped%d", np);
          report("grouped", sh.type, sh.ne0, sh.ne1, 1, mode, us, double(wb) * np, sh.what);
        }
    }
    for (void* p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  for (const Shape& sh : few) {
    const size_t wb = xk::row_bytes(sh.type, sh.ne0) * size_t(sh.ne1);
    const std::vector<void*> w = weight_copies(sh.type, wb, cold_bytes);
    const int copies = int(w.size());
    float *x, *y;
    CK(cudaMalloc(reinterpret_cast<void**>(&x), size_t(sh.ne0) * 4));
    CK(cudaMalloc(reinterpret_cast<void**>(&y), size_t(sh.ne1) * 4));
    {
      std::vector<float> hx(size_t(sh.ne0));
      for (auto& v : hx) v = float(int(next() % 2001) - 1000) / 1000.0f;
      CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    const int reps = quick ? 50 : 400;
    for (const bool cold : {false, true}) {
      const char* mode = cold ? "cold" : "hot";
      const double unsplit = time_us(s, reps, 5, [&](int i) {
        st_ok(xk::matvec(sh.type, w[cold ? size_t(i % copies) : 0], sh.ne0, sh.ne1, x, 1, y, s), "matvec");
      });
      report("matvec", sh.type, sh.ne0, sh.ne1, 1, mode, unsplit, double(wb), sh.what);
      const double split = time_us(s, reps, 5, [&](int i) {
        st_ok(xk::matmul(ctx, sh.type, w[cold ? size_t(i % copies) : 0], sh.ne0, sh.ne1, x, 1, y, nullptr, s),
              "matmul");
      });
      report("matvec-split", sh.type, sh.ne0, sh.ne1, 1, mode, split, double(wb), sh.what);
      std::printf("  (split: %.2fx the unsplit kernel)\n", unsplit / split);
    }
    for (void* p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  xk::context_destroy(ctx);
  CK(cudaStreamDestroy(s));
  return 0;
}
