#include "cli.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

namespace xrun {

const char* usage_text() {
  return "usage: xpack-run -m MODEL.gguf [--pack MODEL.xpack] (-p TEXT | --prompt-ids 1,2,3) [options]\n"
         "\n"
         "Runs a model whose routed experts are served by libxpack (from an Expert Pack),\n"
         "or, without --pack, read straight from a plain GGUF (any shard of a split set).\n"
         "\n"
         "  -m, --model PATH      trunk GGUF written by xpack-build, or a plain GGUF\n"
         "      --pack PATH       Expert Pack (.xpack) holding the routed experts\n"
         "  -p, --prompt TEXT     prompt text, tokenized with the model's tokenizer (BOS as the model says)\n"
         "      --prompt-ids IDS  comma-separated token ids, used as-is (no BOS added)\n"
         "  -n, --n-predict N     tokens to generate (default 32; 0 = only evaluate the prompt)\n"
         "      --greedy          temperature 0, ties to the lowest id (the default)\n"
         "      --temp T          sampling temperature (0 = greedy)\n"
         "      --seed S          sampling seed (default 0)\n"
         "      --cache-mib M     expert cache budget in MiB (fractions allowed); default 2048 on\n"
         "                        the CPU, on CUDA all VRAM left free after the model minus\n"
         "                        --cache-reserve-mib (never more than the pack's experts)\n"
         "      --cache-reserve-mib M  CUDA: VRAM the expert cache leaves free for KV growth and\n"
         "                        activations (default 1024)\n"
         "      --device D        cpu | cuda (default cpu)\n"
         "  -t, --threads N       CPU threads (default: all cores)\n"
         "      --logits-out FILE raw little-endian float32 logits, n_vocab per row: every prompt\n"
         "                        position, then one row per generated token after it is fed back\n"
         "      --json            print one JSON object (ids, text, speeds, engine counters)\n"
         "      --stats PATH      write the engine counters and timings as JSON to PATH\n"
         "      --trace PATH      record the routing trace as CSV 'step,layer,expert' (header line;\n"
         "                        step 0 = the prompt, step i = the i-th fed-back token; one line\n"
         "                        per expert id in each cache request) for xpack-sim --trace.\n"
         "                        Needs --pack and the cache reader\n"
         "      --ignore-eos      keep generating after the end-of-sequence token\n"
         "      --expert-reader R cache: libxpack's expert cache (default); direct: plain reads\n"
         "                        into xpack-run's own LRU buffers (also used when the cache\n"
         "                        cannot be created, e.g. a budget below top-k objects;\n"
         "                        with --trace that is an error instead)\n"
         "      --no-verify-experts  do not check the xxh3 of each expert object read from the\n"
         "                        pack (checked by default, off the compute path; doc/cache.md)\n"
         "      --allow-buffered-io  where the pack's filesystem refuses O_DIRECT (tmpfs, ramfs),\n"
         "                        read experts through the page cache instead of failing\n"
         "                        (warns on stderr; counted in fallback_count)\n"
         "  -h, --help            this text\n";
}

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

namespace {

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  auto [q, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || q != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_float(const std::string& s, float* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno != 0) return false;
  *out = static_cast<float>(v);
  return true;
}

}  // namespace

std::optional<CliOptions> parse_cli(int argc, char** argv, std::string* error) {
  CliOptions o;
  auto fail = [&](const std::string& msg) -> std::optional<CliOptions> {
    *error = msg;
    return std::nullopt;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* v) -> bool {
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    int64_t n = 0;
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    } else if (a == "-m" || a == "--model") {
      if (!value(&o.model_path)) return fail("missing value for " + a);
    } else if (a == "--pack") {
      if (!value(&o.pack_path)) return fail("missing value for --pack");
    } else if (a == "-p" || a == "--prompt") {
      if (!value(&v)) return fail("missing value for " + a);
      o.prompt_text = v;
    } else if (a == "--prompt-ids") {
      if (!value(&v)) return fail("missing value for --prompt-ids");
      auto ids = parse_id_list(v);
      if (!ids) return fail("--prompt-ids: expected comma-separated token ids, got '" + v + "'");
      o.prompt_ids = std::move(*ids);
    } else if (a == "-n" || a == "--n-predict") {
      if (!value(&v) || !parse_int(v, 0, 1 << 24, &n)) return fail(a + ": expected a count >= 0");
      o.n_predict = static_cast<int>(n);
    } else if (a == "--greedy") {
      o.temperature = 0.0f;
    } else if (a == "--temp") {
      if (!value(&v) || !parse_float(v, &o.temperature) || !(o.temperature >= 0.0f))
        return fail("--temp: expected a number >= 0");
    } else if (a == "--seed") {
      if (!value(&v) || !parse_int(v, 0, INT64_MAX, &n)) return fail("--seed: expected an integer >= 0");
      o.seed = static_cast<uint64_t>(n);
    } else if (a == "--cache-mib") {
      float mib = 0;
      if (!value(&v) || !parse_float(v, &mib) || !(mib > 0.0f) || mib > 1e9f)
        return fail("--cache-mib: expected a size in MiB > 0 (fractions allowed)");
      o.cache_mib = mib;
    } else if (a == "--cache-reserve-mib") {
      float mib = 0;
      if (!value(&v) || !parse_float(v, &mib) || !(mib >= 0.0f) || mib > 1e9f)
        return fail("--cache-reserve-mib: expected a size in MiB >= 0");
      o.cache_reserve_mib = mib;
    } else if (a == "--device") {
      if (!value(&o.device)) return fail("missing value for --device");
      if (o.device != "cpu" && o.device != "cuda") return fail("--device: expected cpu or cuda, got '" + o.device + "'");
    } else if (a == "-t" || a == "--threads") {
      if (!value(&v) || !parse_int(v, 1, 1024, &n)) return fail(a + ": expected 1..1024");
      o.threads = static_cast<int>(n);
    } else if (a == "--logits-out") {
      if (!value(&o.logits_out)) return fail("missing value for --logits-out");
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--stats") {
      if (!value(&o.stats_path)) return fail("missing value for --stats");
    } else if (a == "--trace") {
      if (!value(&o.trace_path) || o.trace_path.empty()) return fail("missing value for --trace");
    } else if (a == "--ignore-eos") {
      o.ignore_eos = true;
    } else if (a == "--expert-reader") {
      if (!value(&o.expert_reader) || (o.expert_reader != "cache" && o.expert_reader != "direct"))
        return fail("--expert-reader: expected cache or direct");
    } else if (a == "--verify-experts") {  // the default; kept for scripts
      o.verify_experts = true;
    } else if (a == "--no-verify-experts") {
      o.verify_experts = false;
    } else if (a == "--allow-buffered-io") {
      o.allow_buffered_io = true;
    } else {
      return fail("unknown argument '" + a + "'");
    }
  }
  if (o.model_path.empty()) return fail("-m MODEL is required");
  if (o.prompt_text && o.prompt_ids) return fail("give either -p or --prompt-ids, not both");
  if (!o.prompt_text && !o.prompt_ids) return fail("a prompt is required: -p TEXT or --prompt-ids IDS");
  // Only libxpack's expert cache records routing; refusing here beats an empty trace.
  if (!o.trace_path.empty() && o.pack_path.empty())
    return fail("--trace needs --pack: the routing trace is written by the expert cache, and a plain GGUF's "
                "experts are read without it");
  if (!o.trace_path.empty() && o.expert_reader != "cache")
    return fail("--trace needs --expert-reader cache: the direct reader does not record routing");
  return o;
}

}  // namespace xrun
