// xpack-run: load a model (trunk GGUF + Expert Pack, or a plain GGUF), evaluate
// the prompt as one batch, then decode token by token, with every routed
// expert served through libxpack's C API.
#include <bit>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_cli.h"
#include "cli.h"
#include "experts_factory.h"
#include "host_memory.h"
#include "model.h"
#include "small_pages_warning.h"
#include "cpu_backend.h"
#include "device_backend.h"
#include "sampling.h"
#include "server.h"
#include "stop_strings.h"
#include "text.h"
#include "timings.h"
#include "weights.h"
#include "xpack/xpack.h"

namespace xrun {
namespace {

std::string hex_bytes(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class LogitsWriter {
 public:
  explicit LogitsWriter(const std::string& path) {
    if (path.empty()) return;
    f_.open(path, std::ios::binary | std::ios::trunc);
    if (!f_) throw ModelError("cannot write --logits-out file " + path);
  }
  // Floats are written in host order, which is the file's little-endian order.
  static_assert(std::endian::native == std::endian::little, "--logits-out assumes a little-endian host");
  void write(const float* rows, size_t n_floats) {
    if (!f_.is_open()) return;
    f_.write(reinterpret_cast<const char*>(rows), static_cast<std::streamsize>(n_floats * sizeof(float)));
    if (!f_) throw ModelError("writing --logits-out failed");
  }
  void close() {
    if (f_.is_open()) f_.close();
  }

 private:
  std::ofstream f_;
};

constexpr uint64_t kDefaultCpuCacheMib = 2048;

std::string read_prompt_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ModelError("cannot read the prompt file " + path + " (-f)");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw ModelError("reading the prompt file " + path + " failed (-f)");
  return s;
}

// -c within the model's trained context (0 when the model does not say it).
int64_t context_size(const Weights& w, const CliOptions& o) {
  const int64_t model_ctx = w.get_int(w.arch_key("context_length"), 0);
  if (o.ctx_size > 0 && model_ctx > 0 && o.ctx_size > model_ctx)
    throw ModelError("-c " + std::to_string(o.ctx_size) + " is more than the model's context of " +
                     std::to_string(model_ctx) + " (" + w.arch_key("context_length") + ")");
  return o.ctx_size > 0 ? o.ctx_size : model_ctx;
}

// The GPU's expert cache, once the model is on the device. A cache that cannot
// hold one MoE layer's top-k experts could not run a single token: refused at
// start-up with the numbers, never discovered mid-generation.
void create_gpu_cache(CacheExpertSource& source, const CliOptions& o) {
  std::string why;
  bool capacity = false;
  if (source.create_cache(&why, &capacity)) return;
  if (!capacity) throw ModelError("--device cuda: the expert cache could not be created on the GPU: " + why);
  const double object_mib = double(source.object_bytes()) / 1048576.0;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "--device cuda: the expert cache cannot hold one MoE layer's working set of top-k = %u experts "
                "(%u x %.2f MiB = %.2f MiB) ",
                source.top_k(), source.top_k(), object_mib, object_mib * source.top_k());
  std::string msg = buf;
  if (o.cache_mib > 0) {
    std::snprintf(buf, sizeof buf, "in --cache-mib %.2f", o.cache_mib);
    msg += buf;
  } else {
    std::snprintf(buf, sizeof buf, "in the VRAM left free after the model minus --cache-reserve-mib %.0f",
                  o.cache_reserve_mib);
    msg += buf;
  }
  throw ModelError(msg + ": " + why + "; raise --cache-mib, lower --cache-reserve-mib, or free GPU memory");
}

int32_t cache_policy_of(const std::string& name) {
  if (name == "lru") return XPACK_POLICY_LRU;
  if (name == "lfu") return XPACK_POLICY_LFU;
  if (name == "hybrid") return XPACK_POLICY_HYBRID;
  if (name == "decay") return XPACK_POLICY_DECAY;
  return XPACK_POLICY_ADAPTIVE;  // the CLI admits nothing else
}

// The host tier's size: what was asked, or by default on CUDA 3/4 of the
// host memory available above 1 GiB. Said on stderr either way; asking for
// more than is available is refused (pinned pages cannot be swapped: the
// process would be killed mid-run instead).
uint64_t host_tier_bytes(const CliOptions& o, bool cuda) {
  if (o.host_cache_mib == 0 || (o.host_cache_mib < 0 && !cuda)) return 0;
  const HostMemory mem = available_host_memory();
  const double avail_mib = double(mem.available_bytes) / 1048576.0;
  if (o.host_cache_mib > 0) {
    const uint64_t bytes = static_cast<uint64_t>(o.host_cache_mib * 1048576.0);
    if (bytes > mem.available_bytes) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "--host-cache-mib %.0f is more than the %.0f MiB of host memory available (%s)",
                    o.host_cache_mib, avail_mib, mem.limited_by.c_str());
      throw ModelError(std::string(buf) + "; lower it, or 0 for no host tier");
    }
    return bytes;
  }
  const uint64_t bytes = default_host_tier_bytes(mem.available_bytes);
  std::fprintf(stderr, "xpack-run: host tier up to %.0f MiB: 3/4 of the %.0f MiB available (%s) above 1 GiB; --host-cache-mib sets it\n",
               double(bytes) / 1048576.0, avail_mib, mem.limited_by.c_str());
  return bytes;
}

int run(const CliOptions& o) {
  auto t_load = std::chrono::steady_clock::now();
  // The backend first: a missing GPU (or a build without CUDA) is reported
  // before any model file is read.
  const bool cuda = o.device == "cuda";
  std::unique_ptr<Backend> backend_owner;
  CpuBackend* cpu_backend = nullptr;
  if (cuda) {
    CudaBackendOptions co;
    co.graphs = o.cuda_graphs;
    co.mma_large_from = o.mma_large_from;
    co.no_dp4a = o.no_dp4a;
    co.workspace_bytes = size_t(o.workspace_mib) << 20;
    backend_owner = make_cuda_backend(co);
  } else {
    auto cpu = std::make_unique<CpuBackend>(o.threads);
    cpu_backend = cpu.get();
    backend_owner = std::move(cpu);
  }
  Backend& backend = *backend_owner;
  Weights weights(o.model_path);
  std::unique_ptr<ExpertSource> experts;
  // On the GPU the expert cache is made after the model: its default budget is
  // the VRAM the trunk and the state leave free (doc/xpack-run.md, "VRAM plan").
  CacheExpertSource* cache_after_model = nullptr;
  if (!o.pack_path.empty()) {
    PackSourceOptions po;
    po.pack_path = o.pack_path;
    po.trunk_path = o.model_path;
    po.budget_bytes = o.cache_mib > 0 ? static_cast<uint64_t>(o.cache_mib * 1048576.0)
                                      : (cuda ? 0 : kDefaultCpuCacheMib << 20);
    po.host_cache_bytes = host_tier_bytes(o, cuda);
    po.host_cache_is_default = o.host_cache_mib < 0;
    po.reserve_bytes = cuda ? static_cast<uint64_t>(o.cache_reserve_mib * 1048576.0) : 0;
    po.verify = o.verify_experts;
    po.allow_buffered_io = o.allow_buffered_io;
    po.trace_path = o.trace_path;
    po.threads = o.threads;
    po.cuda = cuda;
    po.policy = cache_policy_of(o.cache_policy);
    po.read_splits = o.read_splits;
    po.queue_depth = o.queue_depth;
    po.overlap = !o.no_overlap;
    const int n_expected = static_cast<int>(weights.get_int(weights.arch_key("expert_count"), 0));
    std::string why_not;
    if (o.expert_reader == "cache" && cuda) {
      std::unique_ptr<CacheExpertSource> source = open_cache_experts(po, n_expected);
      cache_after_model = source.get();
      experts = std::move(source);
    } else if (o.expert_reader == "cache") {
      experts = make_cache_experts(po, n_expected, &why_not);
    }
    if (!experts && po.host_cache_bytes > 0 && !po.host_cache_is_default) {
      // Only the cache has a host tier: reading directly would drop what was asked for.
      throw ModelError("--host-cache-mib: the expert cache could not be created: " + why_not);
    }
    if (!experts && (o.no_overlap || o.cache_policy != "adaptive")) {
      throw ModelError(std::string(o.no_overlap ? "--no-overlap" : "--cache-policy") +
                       ": the expert cache is unavailable (" + why_not + "), and it applies to the cache only");
    }
    if (!experts && !o.trace_path.empty()) {
      // The direct reader records nothing; a silent fallback would leave no trace.
      throw ModelError("--trace: the expert cache is unavailable (" + why_not +
                       "), and only the cache records the routing trace");
    }
    if (!experts && cuda) {
      // The direct reader's buffers are host memory, which the GPU does not compute on.
      throw ModelError("--expert-reader direct is not implemented on CUDA yet; use the expert cache");
    }
    if (!experts) {
      if (!why_not.empty()) std::fprintf(stderr, "xpack-run: expert cache unavailable, reading experts directly: %s\n", why_not.c_str());
      experts = make_pack_experts(po, n_expected);
    }
  } else {
    experts = make_gguf_experts(weights);
    if (cuda) experts = make_uploaded_experts(std::move(experts), backend);
  }
  ModelOptions mo;
  mo.prefetch_next = o.prefetch_next;
  mo.guess_state = o.prefetch_next_from == "renormed" ? GuessState::renormed : GuessState::moe_input;
  mo.hash_prefetch = !o.no_hash_prefetch;
  std::unique_ptr<Model> model = make_model(weights, backend, experts.get(), mo);
  // The source's counters, and the model's own (next-layer guesses).
  auto counters = [&] {
    nlohmann::ordered_json c = experts ? experts->counters_json() : nlohmann::ordered_json::object();
    c.update(model->counters_json());
    return c;
  };
  cuda_fit_workspace(backend);
  if (cache_after_model) create_gpu_cache(*cache_after_model, o);
  if (experts) {
    // The cache's staging memory is measured once the cache exists (on CUDA, after the
    // model): say now if its reads will be split (the library prints nothing).
    const nlohmann::ordered_json c = experts->counters_json();
    if (c.value("host_frames", uint64_t{0}) > 0) {
      // What the cache took: whole experts, at most those its slots cannot hold (plus a spare).
      const uint64_t frames = c["host_frames"].get<uint64_t>();
      const double mib = double(c["host_bytes"].get<uint64_t>()) / 1048576.0;
      std::fprintf(stderr, "xpack-run: host tier: %llu experts in %.0f MiB of pinned host memory\n",
                   static_cast<unsigned long long>(frames - 1), mib);
    }
    if (c.contains("staging_page_bytes")) {
      const std::string w = xpack::tools::small_pages_warning(
          c["staging_page_bytes"].get<uint64_t>(), c["staging_huge_fraction"].get<double>(), c["object_bytes"].get<uint64_t>());
      if (!w.empty()) std::fprintf(stderr, "xpack-run: warning: %s\n", w.c_str());
    }
  }
  if (o.preload_experts && experts) {
    const int64_t n = preload_experts(*experts, static_cast<int>(weights.get_int(weights.arch_key("block_count"))));
    std::fprintf(stderr, "xpack-run: %lld experts preloaded\n", static_cast<long long>(n));
  }
  if (cuda) {
    std::fprintf(stderr, "xpack-run: %s\n", cuda_vram_plan(backend, experts ? experts->device_bytes() : 0).c_str());
  }
  const int n_vocab = model->n_vocab();
  const double load_s = seconds_since(t_load);

  std::unique_ptr<TextCodec> codec = make_text_codec(weights);
  if (o.server) {
    if (!codec) throw ModelError("--server needs a tokenizer, and this model has none");
    const int32_t eos_id = static_cast<int32_t>(weights.get_int("tokenizer.ggml.eos_token_id", -1));
    const int rc = run_server({*model, *codec, weights, o, experts.get(), context_size(weights, o), eos_id});
    if (experts) experts->finish();
    return rc;
  }
  if (o.conversation) {
    if (!codec) throw ModelError("-cnv needs a tokenizer, and this model has none");
    const std::string system = !o.prompt_file.empty() ? read_prompt_file(o.prompt_file) : o.prompt_text.value_or("");
    const int32_t eos_id = static_cast<int32_t>(weights.get_int("tokenizer.ggml.eos_token_id", -1));
    const int rc = run_chat({*model, *codec, weights, o, system, context_size(weights, o), eos_id, load_s}, std::cin,
                            stdout);
    if (experts) experts->finish();
    return rc;
  }
  std::vector<int32_t> prompt;
  if (o.prompt_ids) {
    prompt = *o.prompt_ids;
  } else {
    if (!codec) throw ModelError("-p/-f need a tokenizer, and this build or model has none; use --prompt-ids");
    prompt = codec->encode(o.prompt_file.empty() ? *o.prompt_text : read_prompt_file(o.prompt_file));
  }
  if (prompt.empty()) throw ModelError("the prompt is empty");
  if (!o.stop.empty() && !codec) throw ModelError("--stop matches text, and this model has no tokenizer");
  // Positions past the trained context are not what the model card describes (RoPE
  // and attention were never trained there): refuse them rather than run on quietly.
  const int64_t n_ctx = context_size(weights, o);
  if (n_ctx > 0 && static_cast<int64_t>(prompt.size()) > n_ctx)
    throw ModelError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than " +
                     (o.ctx_size > 0 ? "the context of " + std::to_string(n_ctx) + " (-c)"
                                     : "the model's context of " + std::to_string(n_ctx) + " (" +
                                           weights.arch_key("context_length") + ")"));
  int n_predict = o.n_predict;
  if (n_ctx > 0 && static_cast<int64_t>(prompt.size()) + n_predict > n_ctx) {
    n_predict = static_cast<int>(n_ctx - static_cast<int64_t>(prompt.size()));
    std::fprintf(stderr, "xpack-run: generating %d tokens, not %d: the context holds %lld\n", n_predict,
                 o.n_predict, static_cast<long long>(n_ctx));
  }
  const int32_t eos = static_cast<int32_t>(weights.get_int("tokenizer.ggml.eos_token_id", -1));

  LogitsWriter logits_out(o.logits_out);
  // Every prompt row only when --logits-out records them.
  const LogitRows prompt_rows = o.logits_out.empty() ? LogitRows::last : LogitRows::all;
  std::vector<float> logits((prompt_rows == LogitRows::all ? prompt.size() : 1) * size_t(n_vocab));
  if (o.profile_ops) cuda_profile_section(backend, "prefill");
  const double wait_at_prefill = cuda_host_wait_s(backend);
  auto t_prefill = std::chrono::steady_clock::now();
  model->eval(prompt.data(), static_cast<int>(prompt.size()), 0, logits.data(), prompt_rows);
  const double prefill_s = seconds_since(t_prefill);
  // Decode's own reads and waits are the totals minus these (bench/e2e.sh).
  const nlohmann::ordered_json counters_prefill = counters();
  logits_out.write(logits.data(), logits.size());

  SamplingParams sp = o.sampling;
  sp.seed = o.seed ? *o.seed : random_seed();
  if (!o.seed && sp.temperature > 0) std::fprintf(stderr, "xpack-run: seed %llu\n", static_cast<unsigned long long>(sp.seed));
  Sampler sampler(sp);
  for (int32_t t : prompt) sampler.accept(t);
  StopScanner stops(o.stop);
  std::string finish_reason = "length";
  std::vector<int32_t> gen;
  std::string text;
  const bool stream_text = !o.json && codec;
  std::vector<float> row(logits.end() - n_vocab, logits.end());
  if (o.profile_ops) cuda_profile_section(backend, "decode");
  const double wait_at_decode = cuda_host_wait_s(backend);
  auto t_decode = std::chrono::steady_clock::now();
  int n_decoded = 0;
  for (int i = 0; i < n_predict; ++i) {
    int32_t tok = sampler.sample(row.data(), n_vocab);
    gen.push_back(tok);
    sampler.accept(tok);
    if (codec) {
      const std::string piece = stops.feed(codec->piece(tok));
      text += piece;
      if (stream_text) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      if (stops.stopped()) {
        finish_reason = "stop";
        break;
      }
    }
    if (tok == eos && !o.ignore_eos) {
      finish_reason = "eos";
      break;
    }
    int pos = static_cast<int>(prompt.size() + gen.size()) - 1;
    model->eval(&tok, 1, pos, row.data(), LogitRows::last);
    logits_out.write(row.data(), row.size());
    ++n_decoded;
  }
  const double decode_s = seconds_since(t_decode);
  const double wait_at_end = cuda_host_wait_s(backend);
  if (codec) {
    const std::string tail = stops.flush();
    text += tail;
    if (stream_text) std::fwrite(tail.data(), 1, tail.size(), stdout);
  }
  logits_out.close();
  if (experts) experts->finish();
  // The text ends its line and reaches the terminal/pipe before the speed
  // line goes to stderr; otherwise, with stdout buffered (a pipe or file
  // shared with stderr), the speed line lands after the text on its line.
  if (stream_text) std::fputs("\n", stdout);
  if (!codec && !o.json) {
    // No tokenizer: print the ids so the run is still useful.
    std::printf("%s\n", nlohmann::json(gen).dump().c_str());
  }
  std::fflush(stdout);

  const double prefill_tok_s = prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0;
  const double decode_tok_s = decode_s > 0 && n_decoded > 0 ? double(n_decoded) / decode_s : 0.0;
  nlohmann::ordered_json j;
  j["prompt_ids"] = prompt;
  j["gen_ids"] = gen;
  j["finish_reason"] = finish_reason;
  j["seed"] = sp.seed;
  j["n_ctx"] = n_ctx;
  j["text"] = text;  // raw bytes: dump() below replaces ill-formed UTF-8 with U+FFFD
  j["text_hex"] = hex_bytes(text);
  j["prefill_tok_s"] = prefill_tok_s;
  j["decode_tok_s"] = decode_tok_s;
  j["load_s"] = load_s;
  j["prefill_s"] = prefill_s;
  j["decode_s"] = decode_s;
  j["threads"] = cpu_backend ? cpu_backend->threads() : 0;
  j["backend"] = backend.name();
  j["arch"] = weights.arch();
  j["expert_source"] = o.pack_path.empty() ? "gguf" : "pack";
  j["counters"] = counters();
  j["counters_prefill"] = counters_prefill;
  if (cuda) {
    const CudaGraphCounts g = cuda_graph_counts(backend);
    j["cuda_graphs"] = {{"launches", g.launches}, {"updates", g.updates}, {"instantiations", g.instantiations}};
    j["cuda_host_wait"] = {{"prefill_s", wait_at_decode - wait_at_prefill}, {"decode_s", wait_at_end - wait_at_decode}};
  }
  // Byte tokens make the generated text ill-formed UTF-8 (a character split across
  // tokens, or a model emitting raw bytes). error_handler_t::replace writes each
  // maximal ill-formed subsequence as U+FFFD (as Python's decode('utf-8',
  // 'replace') does), so every JSON parser accepts the output; text_hex keeps the
  // exact bytes. The default handler (strict) would throw instead.
  const std::string js = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  if (o.json) std::printf("%s\n", js.c_str());
  if (!o.stats_path.empty()) {
    std::ofstream sf(o.stats_path, std::ios::trunc);
    sf << js << "\n";
    if (!sf) throw ModelError("cannot write --stats file " + o.stats_path);
  }
  if (o.profile_ops) std::fputs(cuda_profile_report(backend).c_str(), stderr);
  // llama.cpp's timing lines first: scripts read the one-line summary as the last line.
  std::fputs(speed_lines(load_s, prefill_s, prompt.size(), decode_s, static_cast<size_t>(n_decoded)).c_str(), stderr);
  if (!o.json) {
    std::fprintf(stderr, "xpack-run: prompt %zu tokens %.1f tok/s, generated %zu tokens %.1f tok/s\n",
                 prompt.size(), prefill_tok_s, gen.size(), decode_tok_s);
  }
  return 0;
}

}  // namespace
}  // namespace xrun

int main(int argc, char** argv) {
  xrun::CliOptions opts;
  if (auto rc = xrun::parse_cli(argc, argv, &opts)) return *rc;
  if (const std::string why = xrun::server_unavailable(); opts.server && !why.empty()) {
    std::fprintf(stderr, "xpack-run: %s\n", why.c_str());
    return 1;
  }
  try {
    return xrun::run(opts);
  } catch (const xrun::ModelError& e) {
    std::fprintf(stderr, "xpack-run: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpack-run: error: %s\n", e.what());
    return 1;
  }
}
