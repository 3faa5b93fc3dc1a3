#include "cli.h"

#include <charconv>
#include <cstdint>

#include "cli_app.h"
#include "stop_strings.h"

namespace xrun {

std::optional<std::vector<int32_t>> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  const char* p = s.data();
  const char* end = p + s.size();
  if (p == end) return std::nullopt;
  while (p < end) {
    while (p < end && *p == ' ') ++p;
    int64_t v = 0;
    auto [q, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || q == p || v < 0 || v > INT32_MAX) return std::nullopt;
    ids.push_back(static_cast<int32_t>(v));
    p = q;
    while (p < end && *p == ' ') ++p;
    if (p == end) break;
    if (*p != ',') return std::nullopt;
    ++p;
    if (p == end) return std::nullopt;  // trailing comma
  }
  return ids;
}

std::optional<int> parse_cli(int argc, char** argv, CliOptions* out, std::string* message) {
  CliOptions o;
  xpack::cli::App app(
      "xpack-run", "xpack-run -m MODEL.gguf [--pack MODEL.xpack] (-p TEXT | --prompt-ids 1,2,3 | -cnv | --server) [options]",
      "Runs a model whose routed experts are served by libxpack (from an Expert Pack),\n"
      "or, without --pack, read straight from a plain GGUF (any shard of a split set).",
      "exit status: 0 success, 1 failure (a model, pack or I/O error), 2 usage error");
  // xpack-run's wording from before CLI11, which scripts and tests match.
  app.missing_value_message([](const std::string& flag) { return "missing value for " + flag; });
  std::string prompt;
  bool greedy = false, verify = false, no_verify = false;
  uint64_t seed = 0;
  app.text("-m,--model", "PATH", &o.model_path, "trunk GGUF written by xpack-build, or a plain GGUF");
  app.text("--pack", "PATH", &o.pack_path, "Expert Pack (.xpack) holding the routed experts");
  auto* prompt_opt = app.text("-p,--prompt", "TEXT", &prompt,
                              "prompt text, tokenized with the model's tokenizer (BOS as the\n"
                              "model says); with -cnv the system message");
  app.text("-f,--file", "FILE", &o.prompt_file, "the prompt (-p's text) read from FILE");
  app.cli()
      .add_option_function<std::string>(
          "--prompt-ids",
          [&o](const std::string& v) {
            auto ids = parse_id_list(v);
            if (!ids) throw CLI::ValidationError("--prompt-ids", "expected comma-separated token ids, got '" + v + "'");
            o.prompt_ids = std::move(*ids);
          },
          "comma-separated token ids, used as-is (no BOS added)")
      ->option_text("IDS");
  app.count("-n,--n-predict", "N", &o.n_predict, "tokens to generate (default 32; 0 = only evaluate the prompt)", 0,
            1u << 24);
  app.count("-c,--ctx-size", "N", &o.ctx_size, "context size in tokens (default: the model's; never above it)", 1,
            INT64_MAX);
  app.flag("--conversation", &o.conversation,
           "-cnv: chat on the terminal, one user turn per line of stdin,\n"
           "rendered with the model's chat template (doc/xpack-run.md)");
  app.choice("--chat-format", "F", &o.chat_format, {"auto", "deepseek-v4", "kimi-k3", "chatml", "plain"},
             "-cnv and --server: auto (default: from the GGUF's\n"
             "tokenizer.chat_template), deepseek-v4, kimi-k3, chatml or plain");
  app.flag("--server", &o.server,
           "serve the model over an OpenAI-compatible HTTP API\n"
           "(/v1/completions, /v1/chat/completions, /v1/models, /health,\n"
           "/metrics) until stopped; -n is the default max_tokens and the\n"
           "sampling options the default sampling (doc/xpack-run.md)");
  auto* host_opt = app.text("--host", "HOST", &o.host, "--server: the address to listen on (default 127.0.0.1)");
  auto* port_opt = app.count("--port", "N", &o.port, "--server: the TCP port (default 8080; 0 = any free port, printed)", 0,
                             65535);
  auto* queue_opt = app.count("--queue", "N", &o.server_queue,
                              "--server: requests that may wait while one generates\n"
                              "(default 8; one more is answered 503)",
                              0, 1024);
  auto* alias_opt = app.text("--alias", "NAME", &o.server_alias, "--server: the model's id in the API (default: the -m file's name)");
  SamplingParams& sp = o.sampling;
  app.flag("--greedy", &greedy, "temperature 0, ties to the lowest id (the default)");
  auto* temp_opt = app.real("--temp", "T", &sp.temperature, "sampling temperature (0 = greedy)", 0.0, 1e6);
  app.count("--top-k", "K", &sp.top_k, "keep the K most probable tokens (default 0 = off)", 0, INT32_MAX);
  app.real("--top-p", "P", &sp.top_p, "keep the smallest set of tokens holding P of the mass (default 1 = off)", 0.0,
           1.0);
  app.real("--min-p", "P", &sp.min_p, "drop tokens below P x the most probable one's probability (default 0 = off)",
           0.0, 1.0);
  app.real("--repeat-penalty", "R", &sp.repeat_penalty,
           "divide the recent tokens' positive logits by R, multiply\nthe negative ones (default 1 = off)", 0.0, 1e6,
           true);
  app.real("--presence-penalty", "V", &sp.presence_penalty,
           "subtract V from each recent token's logit, once (default 0; -2..2)", -2.0, 2.0);
  app.real("--frequency-penalty", "V", &sp.frequency_penalty,
           "subtract V x its count from each recent token's logit (default 0; -2..2)", -2.0, 2.0);
  app.cli()
      .add_option_function<std::string>(
          "--repeat-last-n",
          [&sp](const std::string& v) {
            if (v == "-1") {
              sp.penalty_last_n = -1;
              return;
            }
            uint64_t n = 0;
            std::string why;
            if (!xpack::cli::parse_count(v, 0, INT32_MAX, &n, &why)) throw CLI::ValidationError("--repeat-last-n", why);
            sp.penalty_last_n = static_cast<int>(n);
          },
          "tokens (prompt included) the penalties look back over\n(default 64; 0 = off, -1 = the whole sequence)")
      ->option_text("N");
  auto* seed_opt = app.count("--seed", "S", &seed, "sampling seed (default: a random one, printed on stderr)", 0,
                             INT64_MAX);
  app.cli()
      .add_option("--stop", o.stop,
                  "stop string (repeatable): generation ends where the text\n"
                  "first contains it; the stop string is not printed")
      ->option_text("TEXT")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.real("--cache-mib", "M", &o.cache_mib,
           "expert cache budget in MiB (fractions allowed); default 2048 on\n"
           "the CPU, on CUDA all VRAM left free after the model minus\n"
           "--cache-reserve-mib (never more than the pack's experts)",
           0.0, 1e9, true);
  app.real("--cache-reserve-mib", "M", &o.cache_reserve_mib,
           "CUDA: VRAM the expert cache leaves free for KV growth and\n"
           "activations (default 1024)",
           0.0, 1e9);
  app.real("--host-cache-mib", "M", &o.host_cache_mib,
           "expert cache's host-RAM tier in MiB, pinned: experts evicted\n"
           "from VRAM wait there, and a miss on one costs a copy, not a\n"
           "read (0 = none). Default on CUDA: 3/4 of the host memory\n"
           "available above 1 GiB (memory cgroup limits included); on\n"
           "the CPU none. More than is available is refused",
           0.0, 1e9);
  app.choice("--device", "D", &o.device, {"cpu", "cuda"}, "cpu | cuda (default cpu)");
  app.count("-t,--threads", "N", &o.threads, "CPU threads, 1..1024 (default: all cores)", 1, 1024);
  app.text("--logits-out", "FILE", &o.logits_out,
           "raw little-endian float32 logits, n_vocab per row: every prompt\n"
           "position, then one row per generated token after it is fed back");
  app.flag("--json", &o.json, "print one JSON object (ids, text, speeds, engine counters)");
  app.text("--stats", "PATH", &o.stats_path, "write the engine counters and timings as JSON to PATH");
  auto* trace_opt = app.text("--trace", "PATH", &o.trace_path,
                             "record the routing trace as CSV 'step,layer,expert' (header line;\n"
                             "step 0 = the prompt, step i = the i-th fed-back token; one line\n"
                             "per expert id in each cache request) for xpack-sim --trace.\n"
                             "Needs --pack and the cache reader");
  app.flag("--ignore-eos", &o.ignore_eos, "keep generating after the end-of-sequence token");
  app.flag("--preload-experts", &o.preload_experts,
           "load every routed expert at start-up (part of the load time), so no\n"
           "token waits for one; the cache must hold them all (--cache-mib)");
  app.choice("--expert-reader", "R", &o.expert_reader, {"cache", "direct"},
             "cache: libxpack's expert cache (default); direct: plain reads\n"
             "into xpack-run's own LRU buffers (also used when the cache\n"
             "cannot be created, e.g. a budget below top-k objects;\n"
             "with --trace that is an error instead)");
  app.flag("--verify-experts", &verify, "check the xxh3 of each expert object read from the pack (the default)");
  app.flag("--no-verify-experts", &no_verify,
           "do not check the xxh3 of each expert object read from the\n"
           "pack (checked by default, off the compute path; doc/cache.md)");
  app.flag("--no-hash-prefetch", &o.no_hash_prefetch,
           "deepseek4 through the expert cache: do not start the hash-routed\n"
           "layers' expert reads when the token is known, only when the\n"
           "layer asks (for measuring; the output is the same)");
  app.count("--prefetch-next", "N", &o.prefetch_next,
            "while a MoE layer computes, guess N experts of the next MoE\n"
            "layer (its router applied to this layer's input) and hand them\n"
            "to the expert source as a low-priority prefetch (default 0 =\n"
            "off; at most the model's experts per layer; the output is the\n"
            "same; doc/xpack-run.md, \"Next-layer prefetch\")",
            0, 65536);
  auto* prefetch_from_opt =
      app.choice("--prefetch-next-from", "S", &o.prefetch_next_from, {"moe-input", "renormed"},
                 "--prefetch-next: the state the next router is applied to:\n"
                 "moe-input (default: this layer's MoE input, after its ffn_norm)\n"
                 "or renormed (the same input under the next layer's ffn_norm)");
  auto* policy_opt = app.choice("--cache-policy", "P", &o.cache_policy, {"adaptive", "lru", "lfu", "hybrid", "decay"},
             "the expert cache's eviction policy: adaptive (default), lru,\n"
             "lfu, hybrid (the seed's) or decay (doc/cache.md, \"Eviction policy\")");
  app.flag("--no-overlap", &o.no_overlap,
           "through the expert cache: each MoE layer waits on the host until\n"
           "all its experts are loaded and only then computes them, as the\n"
           "seed's engine does (the baseline of the ablation; by default the\n"
           "resident experts compute while misses load, each miss as soon as\n"
           "its own copy lands; the output is the same)");
  auto* splits_opt = app.count("--read-splits", "K", &o.read_splits,
                               "through the expert cache: read each expert as K aligned\n"
                               "ranges at once, 1..256 (default 8)",
                               1, 256);
  auto* depth_opt = app.count("--queue-depth", "N", &o.queue_depth,
                              "through the expert cache: io_uring reads in flight at most,\n"
                              "1..4096 (default 8: with N = K the experts land one after\n"
                              "another, each checked and computed while the next is read;\n"
                              "--read-splits 1 --queue-depth 64, libxpack's defaults, has\n"
                              "them all in flight, landing together)",
                              1, 4096);
  app.flag("--profile-ops", &o.profile_ops,
           "--device cuda: time every operation of prefill and of decode on\n"
           "the GPU and on the host, and print a table per phase on stderr\n"
           "(where the step's time goes; the timing itself slows the run)");
  app.flag("--cuda-graphs", &o.cuda_graphs,
           "--device cuda: capture each stretch of a decode step between host\n"
           "round trips as a CUDA graph and launch that, instead of each\n"
           "kernel on its own (the same results; today slower: every step\n"
           "captures and updates its graphs again, doc/xpack-run.md)");
  auto* large_opt = app.count("--mma-large-from", "N", &o.mma_large_from,
                              "--device cuda, for side-by-side measurements: prefill products\n"
                              "of N tokens or more take the tensor cores' 128 x 64 tiles\n"
                              "whatever the grid (default: the rule of doc/kernels.md; the\n"
                              "same results bit for bit, only the speed differs)",
                              1, 1 << 30);
  app.flag("--no-dp4a", &o.no_dp4a,
           "--device cuda, for side-by-side measurements: decode products of\n"
           "K-quant and MXFP4 rows on the FMA units instead of the int8 dp4a\n"
           "ones (doc/kernels.md; other bits within the same bound, only the\n"
           "speed should differ)");
  auto* workspace_opt = app.count("--workspace-mib", "N", &o.workspace_mib,
                                  "--device cuda: the matrix products' workspace, 16..65536\n"
                                  "(default: what the trunk's largest product needs for 4096\n"
                                  "tokens, at least 64, at most a 32nd of the GPU's memory;\n"
                                  "the VRAM plan shows it). A prompt's tensor-core products\n"
                                  "hold its activations split there, 6 bytes an input and\n"
                                  "token, and take a longer prompt in batches of tokens (the\n"
                                  "same bits at any size; other paths may round differently).\n"
                                  "Taken from the expert cache's share",
                                  16, 65536);
  app.flag("--allow-buffered-io", &o.allow_buffered_io,
           "where the pack's filesystem refuses O_DIRECT (tmpfs, ramfs),\n"
           "read experts through the page cache instead of failing\n"
           "(warns on stderr; counted in fallback_count)");

  auto done = [&](std::optional<int> rc) {
    if (message) *message = app.last_message();
    return rc;
  };
  auto fail = [&](const std::string& why) { return done(app.usage_error(why)); };
  // llama.cpp's spelling of the chat flag: CLI11 would read "-cnv" as "-c nv".
  std::vector<char*> args(argv, argv + argc);
  static char conversation_flag[] = "--conversation";
  for (size_t i = 1; i < args.size(); ++i) {
    if (std::string(args[i]) == "--") break;
    if (std::string(args[i]) == "-cnv") args[i] = conversation_flag;
  }
  if (auto rc = app.parse(static_cast<int>(args.size()), args.data())) return done(rc);
  if (prompt_opt->count() > 0) o.prompt_text = prompt;
  if (seed_opt->count() > 0) o.seed = seed;
  if (const std::string why = check_sampling_params(o.sampling); !why.empty()) return fail(why);
  if (const std::string why = check_stop_strings(o.stop); !why.empty()) return fail(why);
  if (greedy && temp_opt->count() > 0 && o.sampling.temperature != 0.0f)
    return fail("--greedy conflicts with --temp " + temp_opt->as<std::string>());
  if (verify && no_verify) return fail("--verify-experts conflicts with --no-verify-experts");
  o.verify_experts = !no_verify;
  if (prefetch_from_opt->count() > 0 && o.prefetch_next == 0)
    return fail("--prefetch-next-from applies to --prefetch-next N (N >= 1) only");
  if (o.model_path.empty()) return fail("-m MODEL is required");
  const int n_prompts = (o.prompt_text ? 1 : 0) + (o.prompt_ids ? 1 : 0) + (o.prompt_file.empty() ? 0 : 1);
  if (n_prompts > 1) return fail("give one of -p, -f or --prompt-ids, not several");
  if (o.conversation && o.prompt_ids)
    return fail("-cnv renders text with the chat template: --prompt-ids cannot be used with it (-p sets the system message)");
  if (o.chat_format != "auto" && !o.conversation && !o.server)
    return fail("--chat-format applies to -cnv and --server only");
  for (auto* opt : {host_opt, port_opt, queue_opt, alias_opt})
    if (opt->count() > 0 && !o.server) return fail(opt->get_name() + " applies to --server only");
  if (o.server) {
    if (n_prompts > 0)
      return fail("--server takes its prompts from the requests: -p, -f and --prompt-ids cannot be used with it");
    if (o.conversation) return fail("--server conflicts with -cnv");
    if (!o.logits_out.empty() || o.json || !o.stats_path.empty() || trace_opt->count() > 0)
      return fail("--logits-out, --json, --stats and --trace are outputs of one run; the server reports its counters "
                  "on GET /metrics");
    if (o.host.empty()) return fail("--host must not be empty");
  }
  if (o.conversation && !o.logits_out.empty()) return fail("--logits-out is not written in -cnv (one-shot runs only)");
  if (n_prompts == 0 && !o.conversation && !o.server)
    return fail("a prompt is required: -p TEXT, -f FILE or --prompt-ids IDS");
  if (trace_opt->count() > 0 && o.trace_path.empty()) return fail("missing value for --trace");
  // Only libxpack's expert cache records routing; refusing here beats an empty trace.
  if (!o.trace_path.empty() && o.pack_path.empty())
    return fail("--trace needs --pack: the routing trace is written by the expert cache, and a plain GGUF's "
                "experts are read without it");
  if (!o.trace_path.empty() && o.expert_reader != "cache")
    return fail("--trace needs --expert-reader cache: the direct reader does not record routing");
  // They change what the expert cache does; anything else would ignore them silently.
  for (const auto& [given, flag] : {std::pair{policy_opt->count() > 0, "--cache-policy"}, {o.no_overlap, "--no-overlap"},
                                    {splits_opt->count() > 0, "--read-splits"}, {depth_opt->count() > 0, "--queue-depth"}})
    if (given && (o.pack_path.empty() || o.expert_reader != "cache"))
      return fail(std::string(flag) + " needs --pack and --expert-reader cache: it applies to the expert cache");
  if (o.cuda_graphs && o.device != "cuda") return fail("--cuda-graphs needs --device cuda");
  if (large_opt->count() > 0 && o.device != "cuda") return fail("--mma-large-from needs --device cuda");
  if (o.no_dp4a && o.device != "cuda") return fail("--no-dp4a needs --device cuda");
  if (workspace_opt->count() > 0 && o.device != "cuda") return fail("--workspace-mib needs --device cuda");
  if (o.profile_ops && o.device != "cuda")
    return fail("--profile-ops needs --device cuda: it times operations on the GPU's stream");
  if (o.profile_ops && (o.server || o.conversation))
    return fail("--profile-ops times one run's prompt and generation, not --server or -cnv");
  *out = std::move(o);
  return done(std::nullopt);
}

}  // namespace xrun
