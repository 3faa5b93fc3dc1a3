// xpack-run's command line (examples/xpack-run/cli.cpp over tools/cli_app.h), and the
// real-number parser it shares with the other tools (cli::parse_real).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cli.h"
#include "cli_app.h"
#include "cli_parse.h"

namespace {

using Parsed = xpack::test::Parsed<xrun::CliOptions>;

Parsed parse(std::vector<const char*> args) {
  return xpack::test::parse_argv<xrun::CliOptions>("xpack-run", xrun::parse_cli, std::move(args));
}

void refused(std::vector<const char*> args, const std::string& want) {
  xpack::test::check_refused(parse(std::move(args)), want);
}

std::optional<double> real(const char* s, double lo = -1e300, double hi = 1e300, bool lo_open = false) {
  double v = 0;
  std::string why;
  if (!xpack::cli::parse_real(s, lo, hi, lo_open, &v, &why)) return std::nullopt;
  return v;
}

}  // namespace

TEST_CASE("cli::parse_real: decimal numbers only, range-checked") {
  CHECK(real("0") == 0.0);
  CHECK(real("0.25") == 0.25);
  CHECK(real(".5") == 0.5);
  CHECK(real("2.") == 2.0);
  CHECK(real("-2") == -2.0);
  CHECK(real("1e-3") == 1e-3);
  CHECK(real("1E+2") == 100.0);
  CHECK(!real(""));
  CHECK(!real("nan"));
  CHECK(!real("NaN"));
  CHECK(!real("inf"));
  CHECK(!real("-inf"));
  CHECK(!real("infinity"));
  CHECK(!real("0x1p3"));
  CHECK(!real("+1"));
  CHECK(!real("1.5x"));
  CHECK(!real("1,5"));
  CHECK(!real(" 1"));
  CHECK(!real("1e"));
  CHECK(!real("e5"));
  CHECK(!real("--1"));
  CHECK(!real("1e999"));  // overflows a double
  CHECK(real("1", 0, 1) == 1.0);
  CHECK(!real("1.0001", 0, 1));
  CHECK(!real("0", 0, 1, true));  // (0, 1]
  CHECK(real("0", 0, 1, false) == 0.0);
  double v = 7;
  std::string why;
  CHECK(!xpack::cli::parse_real("0", 0, 10, true, &v, &why));
  CHECK(why == "0 is out of range (> 0 and <= 10)");
  CHECK(v == 7);  // untouched on failure
  CHECK(!xpack::cli::parse_real("nan", 0, 10, false, &v, &why));
  CHECK(why == "expected a number such as 0.5 or 2, got 'nan'");
}

TEST_CASE("xpack-run: every flag, --key value and --key=value") {
  auto p = parse({"-m", "t.gguf", "--pack", "m.xpack", "-p", "hello world", "-n", "7", "--temp", "0.8", "--seed=42",
                  "--cache-mib", "0.25", "--device", "cuda", "-t", "3", "--logits-out", "l.f32", "--json", "--stats",
                  "s.json", "--trace=t.csv", "--ignore-eos", "--expert-reader", "cache", "--no-verify-experts",
                  "--allow-buffered-io"});
  CAPTURE(p.message);
  REQUIRE(!p.rc);
  CHECK(p.o.model_path == "t.gguf");
  CHECK(p.o.pack_path == "m.xpack");
  CHECK(p.o.prompt_text == std::optional<std::string>("hello world"));
  CHECK(!p.o.prompt_ids);
  CHECK(p.o.n_predict == 7);
  CHECK(p.o.sampling.temperature == 0.8f);
  CHECK(p.o.seed == std::optional<uint64_t>(42));
  CHECK(p.o.cache_mib == 0.25);
  CHECK(p.o.cache_reserve_mib == 1024);
  CHECK(p.o.device == "cuda");
  CHECK(p.o.threads == 3);
  CHECK(p.o.logits_out == "l.f32");
  CHECK(p.o.json);
  CHECK(p.o.stats_path == "s.json");
  CHECK(p.o.trace_path == "t.csv");
  CHECK(p.o.ignore_eos);
  CHECK(!p.o.verify_experts);
  CHECK(p.o.allow_buffered_io);

  p = parse({"--model=x.gguf", "--prompt-ids", "1, 2,3", "--n-predict=0", "--threads", "1", "--greedy",
             "--verify-experts", "--expert-reader=direct"});
  REQUIRE(!p.rc);
  CHECK(p.o.prompt_ids == std::optional<std::vector<int32_t>>({1, 2, 3}));
  CHECK(p.o.n_predict == 0);
  CHECK(p.o.sampling.temperature == 0.0f);
  CHECK(p.o.verify_experts);
  CHECK(p.o.expert_reader == "direct");

  p = parse({"-m", "x.gguf", "--prompt-ids", "5"});  // the defaults
  REQUIRE(!p.rc);
  CHECK(p.o.n_predict == 32);
  CHECK(p.o.sampling.temperature == 0.0f);
  CHECK(p.o.sampling.top_k == 0);
  CHECK(p.o.sampling.top_p == 1.0f);
  CHECK(p.o.sampling.min_p == 0.0f);
  CHECK(p.o.sampling.repeat_penalty == 1.0f);
  CHECK(p.o.sampling.penalty_last_n == 64);
  CHECK(!p.o.seed);  // a random seed, chosen and printed by the run
  CHECK(p.o.stop.empty());
  CHECK(p.o.ctx_size == 0);
  CHECK(!p.o.conversation);
  CHECK(p.o.cache_mib == 0);  // the default: 2048 on the CPU, free VRAM on CUDA
  CHECK(p.o.cache_reserve_mib == 1024);
  CHECK(p.o.device == "cpu");
  CHECK(p.o.threads == 0);
  CHECK(p.o.verify_experts);
  CHECK(p.o.expert_reader == "cache");
  CHECK(!p.o.json);

  p = parse({"-m", "x.gguf", "--prompt-ids", "5", "--cache-reserve-mib", "0"});
  REQUIRE(!p.rc);
  CHECK(p.o.cache_reserve_mib == 0);
  p = parse({"-m", "x.gguf", "--prompt-ids", "5", "--cache-reserve-mib=512.5"});
  REQUIRE(!p.rc);
  CHECK(p.o.cache_reserve_mib == 512.5);

  p = parse({"-m", "x.gguf", "--prompt-ids", "5", "--greedy", "--temp", "0"});  // agree
  REQUIRE(!p.rc);
  p = parse({"-m", "x.gguf", "-p", ""});  // an empty prompt is the runtime's to refuse
  REQUIRE(!p.rc);
  CHECK(p.o.prompt_text == std::optional<std::string>(""));
}

TEST_CASE("xpack-run: sampling, stop strings, context, prompt file and chat flags") {
  auto p = parse({"-m", "x.gguf", "-f", "prompt.txt", "--temp", "0.7", "--top-k", "40", "--top-p", "0.95", "--min-p",
                  "0.05", "--repeat-penalty", "1.1", "--presence-penalty", "-0.5", "--frequency-penalty=0.25",
                  "--repeat-last-n", "-1", "--stop", "END", "--stop", "\n\n", "-c", "2048", "--seed", "0"});
  CAPTURE(p.message);
  REQUIRE(!p.rc);
  CHECK(p.o.prompt_file == "prompt.txt");
  CHECK(!p.o.prompt_text);
  CHECK(p.o.sampling.temperature == 0.7f);
  CHECK(p.o.sampling.top_k == 40);
  CHECK(p.o.sampling.top_p == 0.95f);
  CHECK(p.o.sampling.min_p == 0.05f);
  CHECK(p.o.sampling.repeat_penalty == 1.1f);
  CHECK(p.o.sampling.presence_penalty == -0.5f);
  CHECK(p.o.sampling.frequency_penalty == 0.25f);
  CHECK(p.o.sampling.penalty_last_n == -1);
  CHECK(p.o.stop == std::vector<std::string>{"END", "\n\n"});
  CHECK(p.o.ctx_size == 2048);
  CHECK(p.o.seed == std::optional<uint64_t>(0));  // an explicit 0 is a seed, not "random"
  p = parse({"-m", "x.gguf", "-cnv", "-c", "512"});  // llama.cpp's spelling; no prompt needed
  CAPTURE(p.message);
  REQUIRE(!p.rc);
  CHECK(p.o.conversation);
  CHECK(p.o.ctx_size == 512);
  CHECK(p.o.chat_format == "auto");
  p = parse({"-m", "x.gguf", "--conversation", "-p", "You are terse.", "--chat-format", "kimi-k3"});
  REQUIRE(!p.rc);
  CHECK(p.o.chat_format == "kimi-k3");
  CHECK(p.o.conversation);
  CHECK(p.o.prompt_text == std::optional<std::string>("You are terse."));
  p = parse({"-m", "x.gguf", "--prompt-ids", "1", "--repeat-last-n", "0"});
  REQUIRE(!p.rc);
  CHECK(p.o.sampling.penalty_last_n == 0);
}

TEST_CASE("xpack-run --server: no prompt, the address, the queue; one-run outputs refused") {
  auto p = parse({"-m", "x.gguf", "--server"});
  CAPTURE(p.message);
  REQUIRE(!p.rc);
  CHECK(p.o.server);
  CHECK(p.o.host == "127.0.0.1");
  CHECK(p.o.port == 8080);
  CHECK(p.o.server_queue == 8);
  CHECK(p.o.server_alias.empty());
  p = parse({"-m", "x.gguf", "--server", "--host", "0.0.0.0", "--port", "0", "--queue", "0", "--alias", "story",
             "--chat-format", "chatml", "-n", "64", "--temp", "0.7"});
  REQUIRE(!p.rc);
  CHECK(p.o.host == "0.0.0.0");
  CHECK(p.o.port == 0);
  CHECK(p.o.server_queue == 0);
  CHECK(p.o.server_alias == "story");
  CHECK(p.o.chat_format == "chatml");
  CHECK(p.o.n_predict == 64);
  refused({"-m", "x", "--server", "-p", "hi"}, "--server takes its prompts from the requests");
  refused({"-m", "x", "--server", "--prompt-ids", "1"}, "--server takes its prompts from the requests");
  refused({"-m", "x", "--server", "-cnv"}, "--server conflicts with -cnv");
  refused({"-m", "x", "--server", "--json"}, "the server reports its counters on GET /metrics");
  refused({"-m", "x", "--server", "--stats", "s.json"}, "the server reports its counters on GET /metrics");
  refused({"-m", "x", "--server", "--logits-out", "l.f32"}, "the server reports its counters on GET /metrics");
  refused({"-m", "x", "--server", "--port", "65536"}, "--port");
  refused({"-m", "x", "--server", "--port", "-1"}, "--port");
  refused({"-m", "x", "--server", "--queue", "1025"}, "--queue");
  refused({"-m", "x", "--server", "--host", ""}, "--host");
  refused({"-m", "x", "-p", "hi", "--port", "9000"}, "--port applies to --server only");
  refused({"-m", "x", "-p", "hi", "--host", "::1"}, "--host applies to --server only");
  refused({"-m", "x", "-p", "hi", "--queue", "2"}, "--queue applies to --server only");
  refused({"-m", "x", "-p", "hi", "--alias", "a"}, "--alias applies to --server only");
}

TEST_CASE("xpack-run: --help and --version exit 0") {
  auto p = parse({"--help"});
  REQUIRE(p.rc);
  CHECK(*p.rc == 0);
  p = parse({"--version"});
  REQUIRE(p.rc);
  CHECK(*p.rc == 0);
}

TEST_CASE("xpack-run: bad input is a usage error naming the flag") {
  refused({"--prompt-ids", "1"}, "-m MODEL is required");
  refused({"-m", "x"}, "a prompt is required");
  refused({"-m", "x", "-p", "hi", "--prompt-ids", "1"}, "give one of -p, -f or --prompt-ids");
  refused({"-m", "x", "-p", "hi", "-f", "p.txt"}, "give one of -p, -f or --prompt-ids");
  refused({"-m", "x", "-cnv", "--prompt-ids", "1"}, "--prompt-ids cannot be used with it");
  refused({"-m", "x", "-cnv", "--logits-out", "l.f32"}, "--logits-out is not written in -cnv");
  refused({"-m", "x", "-p", "hi", "--chat-format", "chatml"}, "--chat-format applies to -cnv and --server only");
  refused({"-m", "x", "-cnv", "--chat-format", "jinja"}, "--chat-format: 'jinja' is not one of auto, deepseek-v4");
  refused({"-m", "x", "--prompt-ids", "1", "--top-p", "-0.1"}, "--top-p");
  refused({"-m", "x", "--prompt-ids", "1", "--top-p", "1.5"}, "--top-p");
  refused({"-m", "x", "--prompt-ids", "1", "--top-k", "-1"}, "--top-k");
  refused({"-m", "x", "--prompt-ids", "1", "--min-p", "2"}, "--min-p");
  refused({"-m", "x", "--prompt-ids", "1", "--repeat-penalty", "0"}, "--repeat-penalty");
  refused({"-m", "x", "--prompt-ids", "1", "--presence-penalty", "2.5"}, "--presence-penalty");
  refused({"-m", "x", "--prompt-ids", "1", "--frequency-penalty", "-3"}, "--frequency-penalty");
  refused({"-m", "x", "--prompt-ids", "1", "--repeat-last-n", "-2"}, "--repeat-last-n");
  refused({"-m", "x", "--prompt-ids", "1", "--stop", ""}, "empty stop string");
  refused({"-m", "x", "--prompt-ids", "1", "-c", "0"}, "--ctx-size");
  refused({"-m", "x", "--prompt-ids", "1", "-c", "4K"}, "--ctx-size");
  refused({"-m", "x", "--prompt-ids", "1,x"}, "--prompt-ids");
  refused({"-m", "x", "--prompt-ids", "1,"}, "--prompt-ids");
  refused({"-m", "x", "--prompt-ids", "-1"}, "--prompt-ids");
  refused({"-m", "x", "--prompt-ids", "1", "-n", "1K"}, "a count takes no K/M/G/T suffix");
  refused({"-m", "x", "--prompt-ids", "1", "-n", "16777217"}, "out of range");
  refused({"-m", "x", "--prompt-ids", "1", "-t", "0"}, "--threads: 0 is out of range (1..1024)");
  refused({"-m", "x", "--prompt-ids", "1", "--temp", "nan"}, "--temp: expected a number");
  refused({"-m", "x", "--prompt-ids", "1", "--temp", "inf"}, "--temp: expected a number");
  refused({"-m", "x", "--prompt-ids", "1", "--temp", "-0.5"}, "--temp: -0.5 is out of range (>= 0");
  refused({"-m", "x", "--prompt-ids", "1", "--temp", "hot"}, "--temp");
  refused({"-m", "x", "--prompt-ids", "1", "--cache-mib", "0"}, "--cache-mib: 0 is out of range (> 0");
  refused({"-m", "x", "--prompt-ids", "1", "--cache-mib", "1e10"}, "--cache-mib");
  refused({"-m", "x", "--prompt-ids", "1", "--cache-mib", "64M"}, "--cache-mib: expected a number");
  refused({"-m", "x", "--prompt-ids", "1", "--seed", "-3"}, "--seed");
  refused({"-m", "x", "--prompt-ids", "1", "--cache-reserve-mib", "-1"}, "--cache-reserve-mib");
  refused({"-m", "x", "--prompt-ids", "1", "--cache-reserve-mib", "nan"}, "--cache-reserve-mib: expected a number");
  refused({"-m", "x", "--prompt-ids", "1", "--device", "rocm"}, "--device: 'rocm' is not one of cpu, cuda");
  refused({"-m", "x", "--prompt-ids", "1", "--expert-reader", "mmap"}, "--expert-reader");
  refused({"-m", "x", "--prompt-ids", "1", "--bogus"}, "unknown option --bogus");
  refused({"-m", "x", "--prompt-ids", "1", "stray"}, "unexpected argument 'stray'");
  refused({"-m", "x", "--prompt-ids", "1", "--pack"}, "missing value for --pack");
  refused({"-m", "x", "--prompt-ids", "1", "--trace"}, "missing value for --trace");
  refused({"-m", "x", "--prompt-ids", "1", "--greedy", "--temp", "0.7"}, "--greedy conflicts with --temp 0.7");
  refused({"-m", "x", "--prompt-ids", "1", "--verify-experts", "--no-verify-experts"}, "conflicts");
  refused({"-m", "x", "--prompt-ids", "1", "--trace", ""}, "missing value for --trace");
  refused({"-m", "x", "--prompt-ids", "1", "--trace", "t.csv"}, "--trace needs --pack");
  refused({"-m", "x", "--pack", "p", "--prompt-ids", "1", "--trace", "t.csv", "--expert-reader", "direct"},
          "--trace needs --expert-reader cache");
}

TEST_CASE("xpack-run: --no-hash-prefetch") {
  auto p = parse({"-m", "x", "--prompt-ids", "1"});
  REQUIRE(!p.rc);
  CHECK(!p.o.no_hash_prefetch);  // prefetching is the default
  p = parse({"-m", "x", "--prompt-ids", "1", "--no-hash-prefetch"});
  REQUIRE(!p.rc);
  CHECK(p.o.no_hash_prefetch);
  refused({"-m", "x", "--prompt-ids", "1", "--no-hash-prefetch=maybe"}, "--no-hash-prefetch: 'maybe' is not a valid value");
}

TEST_CASE("xpack-run: --prefetch-next and --prefetch-next-from") {
  auto p = parse({"-m", "x", "--prompt-ids", "1"});
  REQUIRE(!p.rc);
  CHECK(p.o.prefetch_next == 0);  // off by default (doc/xpack-run.md says why)
  CHECK(p.o.prefetch_next_from == "moe-input");
  p = parse({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "4"});
  REQUIRE(!p.rc);
  CHECK(p.o.prefetch_next == 4);
  p = parse({"-m", "x", "--prompt-ids", "1", "--prefetch-next=0"});
  REQUIRE(!p.rc);
  CHECK(p.o.prefetch_next == 0);
  p = parse({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "8", "--prefetch-next-from", "renormed"});
  REQUIRE(!p.rc);
  CHECK(p.o.prefetch_next == 8);
  CHECK(p.o.prefetch_next_from == "renormed");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "-1"}, "--prefetch-next");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "x"}, "--prefetch-next");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "2.5"}, "--prefetch-next");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "65537"}, "--prefetch-next: 65537 is out of range");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next"}, "missing value for --prefetch-next");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "2", "--prefetch-next-from", "attn"},
          "--prefetch-next-from: 'attn' is not one of moe-input, renormed");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next-from", "renormed"},
          "--prefetch-next-from applies to --prefetch-next N (N >= 1) only");
  refused({"-m", "x", "--prompt-ids", "1", "--prefetch-next", "0", "--prefetch-next-from", "renormed"},
          "--prefetch-next-from applies to --prefetch-next N (N >= 1) only");
}

TEST_CASE("xpack-run: --profile-ops is for one CUDA run") {
  auto p = parse({"-m", "x", "--prompt-ids", "1"});
  REQUIRE(!p.rc);
  CHECK(!p.o.profile_ops);  // off by default: the events slow the host
  p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--profile-ops"});
  REQUIRE(!p.rc);
  CHECK(p.o.profile_ops);
  refused({"-m", "x", "--prompt-ids", "1", "--profile-ops"}, "--profile-ops needs --device cuda");
  refused({"-m", "x", "--device", "cuda", "--server", "--profile-ops"}, "not --server or -cnv");
  refused({"-m", "x", "--device", "cuda", "-cnv", "--profile-ops"}, "not --server or -cnv");
}

TEST_CASE("xpack-run: --cuda-graphs is for CUDA runs") {
  auto p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda"});
  REQUIRE(!p.rc);
  CHECK(!p.o.cuda_graphs);  // off by default: measured slower (doc/xpack-run.md)
  p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--cuda-graphs"});
  REQUIRE(!p.rc);
  CHECK(p.o.cuda_graphs);
  refused({"-m", "x", "--prompt-ids", "1", "--cuda-graphs"}, "--cuda-graphs needs --device cuda");
}

TEST_CASE("xpack-run: --workspace-mib is for CUDA runs, 16..65536") {
  auto p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda"});
  REQUIRE(!p.rc);
  CHECK(p.o.workspace_mib == 0);  // the kernels' default, 64 MiB
  p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--workspace-mib", "256"});
  REQUIRE(!p.rc);
  CHECK(p.o.workspace_mib == 256);
  refused({"-m", "x", "--prompt-ids", "1", "--workspace-mib", "256"}, "--workspace-mib needs --device cuda");
  for (const char* bad : {"0", "15", "65537", "-1", "1e3", "4294967296"}) {
    CAPTURE(bad);
    refused({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--workspace-mib", bad}, "--workspace-mib");
  }
}

TEST_CASE("xpack-run: --mma-large-from is for CUDA runs, a positive token count") {
  auto p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda"});
  REQUIRE(!p.rc);
  CHECK(p.o.mma_large_from == 0);  // the rule
  p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--mma-large-from", "128"});
  REQUIRE(!p.rc);
  CHECK(p.o.mma_large_from == 128);
  refused({"-m", "x", "--prompt-ids", "1", "--mma-large-from", "128"}, "--mma-large-from needs --device cuda");
  for (const char* bad : {"0", "-3", "x", "2147483648"}) {
    CAPTURE(bad);
    refused({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--mma-large-from", bad}, "--mma-large-from");
  }
}

TEST_CASE("xpack-run: --no-dp4a is for CUDA runs") {
  auto p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda"});
  REQUIRE(!p.rc);
  CHECK(!p.o.no_dp4a);  // dp4a by default
  p = parse({"-m", "x", "--prompt-ids", "1", "--device", "cuda", "--no-dp4a"});
  REQUIRE(!p.rc);
  CHECK(p.o.no_dp4a);
  refused({"-m", "x", "--prompt-ids", "1", "--no-dp4a"}, "--no-dp4a needs --device cuda");
}

TEST_CASE("xpack-run: the expert cache's reads default to 8 ranges an expert, 8 in flight") {
  auto p = parse({"-m", "x", "--prompt-ids", "1", "--pack", "p.xpack"});
  REQUIRE(!p.rc);
  // One expert's ranges fill the queue: a layer's experts land one after another.
  CHECK(p.o.read_splits == 8);
  CHECK(p.o.queue_depth == 8);
  p = parse({"-m", "x", "--prompt-ids", "1", "--pack", "p.xpack", "--read-splits", "1", "--queue-depth", "64"});
  REQUIRE(!p.rc);
  CHECK(p.o.read_splits == 1);
  CHECK(p.o.queue_depth == 64);
  refused({"-m", "x", "--prompt-ids", "1", "--pack", "p.xpack", "--read-splits", "x"}, "--read-splits");
  refused({"-m", "x", "--prompt-ids", "1", "--pack", "p.xpack", "--queue-depth", "0"}, "--queue-depth");
}
