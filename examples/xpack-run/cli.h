// Command line of xpack-run (over tools/cli_app.h): what the user asked for, parsed
// and checked before any model file is touched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sampling.h"

namespace xrun {

struct CliOptions {
  std::string model_path;        // -m: trunk GGUF (with --pack) or a plain GGUF / any shard
  std::string pack_path;         // --pack: Expert Pack; empty = experts from the GGUF itself
  std::optional<std::string> prompt_text;              // -p
  std::string prompt_file;                             // -f: the prompt read from this file
  std::optional<std::vector<int32_t>> prompt_ids;      // --prompt-ids (used as-is, no BOS)
  int n_predict = 32;            // -n; 0 = only evaluate the prompt
  // temperature 0 = greedy (ties -> lowest id); seed is set from `seed` below.
  SamplingParams sampling;
  std::optional<uint64_t> seed;  // --seed; absent = a random seed, printed
  std::vector<std::string> stop; // --stop (repeatable): generation ends before the first one
  int64_t ctx_size = 0;          // -c: context in tokens; 0 = the model's
  bool conversation = false;     // -cnv: interactive chat on the terminal
  std::string chat_format = "auto";  // -cnv, --server: auto (from tokenizer.chat_template) or a format name
  bool server = false;           // --server: an OpenAI-compatible HTTP API instead of one run
  std::string host = "127.0.0.1";  // --host: the address the server binds
  int port = 8080;               // --port; 0 = any free port (printed)
  int server_queue = 8;          // --queue: requests that may wait while one generates
  std::string server_alias;      // --alias: the model's id in the API; empty = the -m file's name
  // Expert cache budget in MiB (fractions allowed: 0.25); 0 = the default:
  // 2048 on the CPU, on CUDA the VRAM left free after the model minus the reserve.
  double cache_mib = 0;
  double cache_reserve_mib = 1024;  // CUDA: VRAM the cache leaves free (KV growth, activations)
  // The cache's host-RAM tier in MiB; -1 = the default: on CUDA 3/4 of the host
  // memory available above 1 GiB (host_memory.h), on the CPU none (its slots
  // are host memory already: a larger --cache-mib does the same job).
  double host_cache_mib = -1;
  std::string device = "cpu";
  int threads = 0;               // 0 = hardware concurrency
  std::string logits_out;        // raw f32 rows
  bool json = false;
  std::string stats_path;
  std::string trace_path;        // --trace: routing trace CSV written by the expert cache
  bool ignore_eos = false;
  bool preload_experts = false;  // load every routed expert before the prompt (all-resident runs)
  std::string expert_reader = "cache";  // cache (libxpack expert cache) | direct
  bool verify_experts = true;    // checksum every expert object read from the pack
  bool allow_buffered_io = false;  // where O_DIRECT is refused, read through the page cache (warns)
  bool no_hash_prefetch = false;   // deepseek4: the hash layers' exact experts are not prefetched (for measuring)
  int prefetch_next = 0;           // --prefetch-next: next-layer experts guessed per MoE layer (0 = off)
  std::string prefetch_next_from = "moe-input";  // --prefetch-next-from: the state the guess routes
  std::string cache_policy = "adaptive";  // --cache-policy: the expert cache's eviction policy
  bool no_overlap = false;         // --no-overlap: a MoE layer computes once all its experts are in (baseline)
  // --read-splits, --queue-depth: one expert's ranges fill the queue, so the experts of a
  // layer land one after another (doc/xpack-run.md; libxpack's own defaults are 1 and 64).
  uint32_t read_splits = 8;
  uint32_t queue_depth = 8;
  bool cuda_graphs = false;        // --cuda-graphs: decode stretches launched as CUDA graphs (CUDA)
  bool profile_ops = false;        // --profile-ops: per-operation GPU and host time, a table on stderr (CUDA)
  int mma_large_from = 0;          // --mma-large-from: prefill products of N tokens or more in 128 x 64 tiles (CUDA; 0: the rule)
  bool no_dp4a = false;            // --no-dp4a: K-quant and MXFP4 decode on the FMA units (CUDA)
  uint32_t workspace_mib = 0;      // --workspace-mib: the CUDA matrix products' workspace (0: fitted to the trunk)
};

// Parses argv into *out. nullopt: run with *out. Otherwise the exit status to return at
// once: 0 after --help or --version (printed on stdout), 2 after a usage error (one
// line on stderr; its text also in *message when given).
std::optional<int> parse_cli(int argc, char** argv, CliOptions* out, std::string* message = nullptr);

// Comma-separated non-negative token ids ("1,2,3"); nullopt on any junk.
std::optional<std::vector<int32_t>> parse_id_list(const std::string& s);

}  // namespace xrun
