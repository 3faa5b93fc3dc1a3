// xpack-synth: writes small synthetic MoE GGUFs shaped like the seed models
// (DeepSeek-V4-Flash, Kimi-K3) or Mixtral, with valid quant blocks and random
// weights, optionally as a gguf-split set. Used by tests, CI and the quick start.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_app.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf_writer.h"

namespace {

using xpack::Status;
using xpack::gguf::KeyValue;
using xpack::gguf::Value;
namespace val = xpack::gguf::val;

enum class Arch { DeepSeek4, KimiK3, Mixtral };

struct Options {
  Arch arch = Arch::DeepSeek4;
  std::string arch_name;
  uint32_t layers = 4, experts = 8, top_k = 2, embd = 256, ff = 256, latent = 0, vocab = 512;
  int64_t dense = -1;
  uint32_t shards = 0;
  uint64_t seed = 1;
  bool fused = false, quiet = false;
  std::string out;
};

constexpr uint32_t F32 = 0, Q8_0 = 8, Q2_K = 10, Q3_K = 11, I32 = 26, MXFP4 = 39;

struct TensorSpec {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;
  uint32_t int_bound = 0;  // I32 tensors: values in [0, int_bound)
};

// ---- deterministic random data ----------------------------------------------

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Each tensor's stream depends only on the seed and its name, so a split set and
// a single file written with the same options hold identical tensor bytes.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  uint64_t s = seed ^ h;
  return splitmix64(s);
}

void fill_random(uint8_t* p, size_t n, uint64_t& s) {
  while (n >= 8) {
    uint64_t r = splitmix64(s);
    std::memcpy(p, &r, 8);
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t r = splitmix64(s);
    std::memcpy(p, &r, n);
  }
}

// A positive normal f16 in [2^-11, 2^-7): always finite, and small enough that
// dequantized weights stay within about +-1 like real ones.
uint16_t random_f16_scale(uint64_t& s) {
  uint64_t r = splitmix64(s);
  uint16_t exp = static_cast<uint16_t>(4 + r % 4);
  return static_cast<uint16_t>((exp << 10) | ((r >> 8) & 0x3FF));
}

void put_u16le(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

Status fill_tensor(const TensorSpec& t, uint64_t seed, uint8_t* dst, size_t n) {
  uint64_t s = tensor_seed(seed, t.name);
  switch (t.type) {
    case F32: {
      for (size_t i = 0; i + 4 <= n; i += 4) {
        // Uniform in [-0.0625, 0.0625): small, finite, like initialised weights.
        float f = static_cast<float>(static_cast<int32_t>(splitmix64(s) >> 32)) * (0.0625f / 2147483648.0f);
        std::memcpy(dst + i, &f, 4);
      }
      return {};
    }
    case I32: {
      for (size_t i = 0; i + 4 <= n; i += 4) {
        int32_t v = static_cast<int32_t>(splitmix64(s) % (t.int_bound ? t.int_bound : 1));
        std::memcpy(dst + i, &v, 4);
      }
      return {};
    }
    default: break;
  }
  const auto* ti = xpack::gguf::type_info(t.type);
  if (!ti) return xpack::err(XPACK_E_UNKNOWN_TYPE, "no generator for type {}", t.type);
  fill_random(dst, n, s);  // random quants everywhere, then valid scales on top
  for (size_t b = 0; b + ti->block_bytes <= n; b += ti->block_bytes) {
    uint8_t* blk = dst + b;
    switch (t.type) {
      case Q8_0: put_u16le(blk, random_f16_scale(s)); break;                 // d @0
      case Q2_K:
        put_u16le(blk + 80, random_f16_scale(s));                            // d @80
        put_u16le(blk + 82, random_f16_scale(s));                            // dmin @82
        break;
      case Q3_K: put_u16le(blk + 108, random_f16_scale(s)); break;           // d @108
      case MXFP4: blk[0] = static_cast<uint8_t>(116 + splitmix64(s) % 9); break;  // 2^-12..2^-4
      default:
        return xpack::err(XPACK_E_UNSUPPORTED, "no generator for type {}", ti->name);
    }
  }
  return {};
}

// ---- model shape ------------------------------------------------------------

struct Model {
  std::vector<KeyValue> kvs;
  std::vector<TensorSpec> tensors;
};

void add(Model& m, std::string name, uint32_t type, std::vector<uint64_t> ne, uint32_t bound = 0) {
  m.tensors.push_back(TensorSpec{std::move(name), type, std::move(ne), bound});
}

std::string blk(uint32_t i, const char* what) { return "blk." + std::to_string(i) + "." + what; }

Model describe(const Options& o) {
  Model m;
  const std::string& a = o.arch_name;
  const uint64_t E = o.embd, F = o.ff, X = o.experts, V = o.vocab;
  const uint32_t dense = static_cast<uint32_t>(o.dense);
  const uint32_t n_head = 4, head_dim = 64, shared = o.arch == Arch::KimiK3 ? 2 : 1;
  const uint64_t expert_in = o.arch == Arch::KimiK3 ? o.latent : E;
  const uint32_t expert_type_gu = o.arch == Arch::DeepSeek4 ? MXFP4 : o.arch == Arch::KimiK3 ? Q2_K : Q8_0;
  const uint32_t expert_type_down = o.arch == Arch::DeepSeek4 ? MXFP4 : o.arch == Arch::KimiK3 ? Q3_K : Q8_0;
  const uint32_t hash_layers = o.arch == Arch::DeepSeek4 ? std::min<uint32_t>(3, o.layers) : 0;

  auto kv = [&](std::string k, Value v) { m.kvs.push_back({std::move(k), std::move(v)}); };
  auto akv = [&](const char* k, Value v) { kv(a + "." + k, std::move(v)); };
  kv("general.architecture", val::str(a));
  kv("general.name", val::str("xpack-synth-" + std::string(o.arch == Arch::Mixtral ? "mixtral" : a) +
                              "-seed" + std::to_string(o.seed)));
  kv("general.description", val::str("synthetic random weights written by xpack-synth; not a trained model"));
  kv("general.quantization_version", val::u32(2));
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_type;
  for (uint32_t i = 0; i < o.vocab; ++i) {
    tokens.push_back(i < 3 ? (i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>") : "tok" + std::to_string(i));
    scores.push_back(-static_cast<float>(i));
    token_type.push_back(i < 3 ? 3 : 1);
  }
  kv("tokenizer.ggml.model", val::str("llama"));
  kv("tokenizer.ggml.tokens", val::str_array(tokens));
  kv("tokenizer.ggml.scores", val::f32_array(scores));
  kv("tokenizer.ggml.token_type", val::i32_array(token_type));
  kv("tokenizer.ggml.bos_token_id", val::u32(1));
  kv("tokenizer.ggml.eos_token_id", val::u32(2));
  akv("block_count", val::u32(o.layers));
  akv("context_length", val::u32(4096));
  akv("embedding_length", val::u32(o.embd));
  akv("feed_forward_length", val::u32(2 * o.ff));
  akv("vocab_size", val::u32(o.vocab));
  akv("attention.head_count", val::u32(n_head));
  akv("attention.head_count_kv", val::u32(o.arch == Arch::Mixtral ? 1 : n_head));
  akv("attention.layer_norm_rms_epsilon", val::f32(1e-5f));
  akv("expert_count", val::u32(o.experts));
  akv("expert_used_count", val::u32(o.top_k));
  if (o.arch != Arch::Mixtral) {
    akv("leading_dense_block_count", val::u32(dense));
    akv("expert_feed_forward_length", val::u32(o.ff));
    akv("expert_shared_count", val::u32(shared));
    akv("expert_weights_norm", val::boolean(true));
    akv("expert_weights_scale", val::f32(o.arch == Arch::DeepSeek4 ? 1.5f : 1.0f));
    akv("expert_gating_func", val::u32(o.arch == Arch::DeepSeek4 ? 4 : 2));
    akv("attention.q_lora_rank", val::u32(64));
    akv("attention.kv_lora_rank", val::u32(64));
  }
  if (o.arch == Arch::DeepSeek4) {
    akv("hash_layer_count", val::u32(hash_layers));
    akv("hyper_connection.count", val::u32(4));
    akv("hyper_connection.sinkhorn_iterations", val::u32(20));
    std::vector<uint32_t> ratios;
    for (uint32_t i = 0; i < o.layers; ++i) ratios.push_back(i % 2 ? 4 : 0);
    akv("attention.compress_ratios", val::u32_array(ratios));
  }
  if (o.arch == Arch::KimiK3) {
    akv("expert_latent_length", val::u32(o.latent));
    akv("attn_res.block_size", val::u32(2));
    akv("activation.situ_beta", val::f32(4.0f));
    akv("activation.situ_linear_beta", val::f32(25.0f));
  }

  add(m, "token_embd.weight", Q8_0, {E, V});
  add(m, "output_norm.weight", F32, {E});
  add(m, "output.weight", Q8_0, {E, V});
  if (o.arch == Arch::DeepSeek4) {
    add(m, "output_hc_fn.weight", F32, {4 * E, 4});
    add(m, "output_hc_base.weight", F32, {4});
    add(m, "output_hc_scale.weight", F32, {1});
  }
  if (o.arch == Arch::KimiK3) add(m, "output_res_score.weight", F32, {E});

  for (uint32_t i = 0; i < o.layers; ++i) {
    add(m, blk(i, "attn_norm.weight"), F32, {E});
    add(m, blk(i, "ffn_norm.weight"), F32, {E});
    switch (o.arch) {
      case Arch::DeepSeek4:
        add(m, blk(i, "attn_q_a.weight"), Q8_0, {E, 64});
        add(m, blk(i, "attn_q_a_norm.weight"), F32, {64});
        add(m, blk(i, "attn_q_b.weight"), Q8_0, {64, n_head * head_dim});
        add(m, blk(i, "attn_kv.weight"), Q8_0, {E, head_dim});
        add(m, blk(i, "attn_kv_a_norm.weight"), F32, {head_dim});
        add(m, blk(i, "attn_sinks.weight"), F32, {n_head});
        add(m, blk(i, "attn_output_a.weight"), Q8_0, {n_head * head_dim / 2, 2 * 64});
        add(m, blk(i, "attn_output_b.weight"), Q8_0, {2 * 64, E});
        for (const char* hc : {"hc_attn", "hc_ffn"}) {
          add(m, blk(i, (std::string(hc) + "_fn.weight").c_str()), F32, {4 * E, 24});
          add(m, blk(i, (std::string(hc) + "_base.weight").c_str()), F32, {24});
          add(m, blk(i, (std::string(hc) + "_scale.weight").c_str()), F32, {3});
        }
        break;
      case Arch::KimiK3:
        add(m, blk(i, "attn_q_a.weight"), Q8_0, {E, 64});
        add(m, blk(i, "attn_q_a_norm.weight"), F32, {64});
        add(m, blk(i, "attn_q_b.weight"), Q8_0, {64, n_head * head_dim});
        add(m, blk(i, "attn_kv_a_mqa.weight"), Q8_0, {E, 64 + 32});
        add(m, blk(i, "attn_kv_a_norm.weight"), F32, {64});
        add(m, blk(i, "attn_kv_b.weight"), Q8_0, {64, n_head * 2 * head_dim});
        add(m, blk(i, "attn_gate.weight"), Q8_0, {E, n_head * head_dim});
        add(m, blk(i, "attn_output.weight"), Q8_0, {n_head * head_dim, E});
        add(m, blk(i, "attn_res_score.weight"), F32, {E});
        add(m, blk(i, "ffn_res_score.weight"), F32, {E});
        break;
      case Arch::Mixtral:
        add(m, blk(i, "attn_q.weight"), Q8_0, {E, E});
        add(m, blk(i, "attn_k.weight"), Q8_0, {E, E / n_head});
        add(m, blk(i, "attn_v.weight"), Q8_0, {E, E / n_head});
        add(m, blk(i, "attn_output.weight"), Q8_0, {E, E});
        break;
    }
    if (i < dense) {
      add(m, blk(i, "ffn_gate.weight"), Q8_0, {E, 2 * F});
      add(m, blk(i, "ffn_up.weight"), Q8_0, {E, 2 * F});
      add(m, blk(i, "ffn_down.weight"), Q8_0, {2 * F, E});
      continue;
    }
    add(m, blk(i, "ffn_gate_inp.weight"), F32, {E, X});
    if (o.arch != Arch::Mixtral) add(m, blk(i, "exp_probs_b.bias"), F32, {X});
    if (i < hash_layers) add(m, blk(i, "ffn_gate_tid2eid.weight"), I32, {o.top_k, V}, o.experts);
    if (o.arch == Arch::KimiK3) {
      add(m, blk(i, "ffn_routed_down.weight"), Q8_0, {E, expert_in});
      add(m, blk(i, "ffn_routed_norm.weight"), F32, {expert_in});
      add(m, blk(i, "ffn_routed_up.weight"), Q8_0, {expert_in, E});
    }
    if (o.fused) {
      add(m, blk(i, "ffn_gate_up_exps.weight"), expert_type_gu, {expert_in, 2 * F, X});
    } else {
      add(m, blk(i, "ffn_gate_exps.weight"), expert_type_gu, {expert_in, F, X});
      add(m, blk(i, "ffn_up_exps.weight"), expert_type_gu, {expert_in, F, X});
    }
    add(m, blk(i, "ffn_down_exps.weight"), expert_type_down, {F, expert_in, X});
    if (o.arch != Arch::Mixtral) {
      add(m, blk(i, "ffn_gate_shexp.weight"), Q8_0, {E, F * shared});
      add(m, blk(i, "ffn_up_shexp.weight"), Q8_0, {E, F * shared});
      add(m, blk(i, "ffn_down_shexp.weight"), Q8_0, {F * shared, E});
    }
  }
  return m;
}

// ---- output -----------------------------------------------------------------

Status write_file(const std::string& path, const std::vector<KeyValue>& kvs,
                  const std::vector<const TensorSpec*>& tensors, uint64_t seed, uint64_t* bytes) {
  xpack::gguf::Writer w;
  for (const auto& kv : kvs) w.add_kv(kv);
  for (const auto* t : tensors) w.add_tensor(t->name, t->type, t->ne);
  *bytes += w.total_size();
  return xpack::gguf::write_gguf(path, w, [&](size_t i, uint8_t* dst, size_t n) {
    return fill_tensor(*tensors[i], seed, dst, n);
  });
}

std::string strip_gguf(const std::string& p) {
  const std::string ext = ".gguf";
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0)
    return p.substr(0, p.size() - ext.size());
  return p;
}

Status run(const Options& o) {
  Model m = describe(o);
  uint64_t bytes = 0;
  std::vector<std::string> written;
  if (o.shards == 0) {
    std::vector<const TensorSpec*> all;
    for (const auto& t : m.tensors) all.push_back(&t);
    XPACK_TRY(write_file(o.out, m.kvs, all, o.seed, &bytes));
    written.push_back(o.out);
  } else {
    // Like llama-gguf-split: contiguous runs of tensors, whole tensors only; all
    // metadata in the first shard, the three split keys in every shard.
    const size_t n = m.tensors.size();
    if (o.shards > n)
      return xpack::err(XPACK_E_INVALID_ARG, "--shards {} exceeds the {} tensors", o.shards, n);
    const size_t per = (n + o.shards - 1) / o.shards;
    const std::string prefix = strip_gguf(o.out);
    for (uint32_t k = 0; k < o.shards; ++k) {
      std::vector<KeyValue> kvs = k == 0 ? m.kvs : std::vector<KeyValue>{};
      kvs.push_back({"split.no", val::u16(static_cast<uint16_t>(k))});
      kvs.push_back({"split.count", val::u16(static_cast<uint16_t>(o.shards))});
      kvs.push_back({"split.tensors.count", val::i32(static_cast<int32_t>(n))});
      std::vector<const TensorSpec*> part;
      for (size_t i = k * per; i < std::min(n, (k + 1) * per); ++i) part.push_back(&m.tensors[i]);
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, "-%05u-of-%05u.gguf", k + 1, o.shards);
      std::string path = prefix + suffix;
      XPACK_TRY(write_file(path, kvs, part, o.seed, &bytes));
      written.push_back(path);
    }
  }
  if (!o.quiet) {
    for (const auto& p : written) std::printf("wrote %s\n", p.c_str());
    std::printf("%s: %u layers (%" PRId64 " dense), %u experts, top-%u, %zu tensors, %" PRIu64
                " bytes\n",
                o.arch_name.c_str(), o.layers, o.dense, o.experts, o.top_k, m.tensors.size(), bytes);
  }
  return {};
}

// ---- command line -----------------------------------------------------------

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string arch;
  uint32_t dense = 0;
  xpack::cli::App app("xpack-synth", "xpack-synth --arch ARCH [options] -o OUT.gguf",
                      "Writes a synthetic Mixture-of-Experts GGUF with random (valid) weights.",
                      "Expert tensor types: deepseek4 MXFP4 (gate, up, down); kimi-k3 Q2_K gate/up and Q3_K\n"
                      "down; mixtral Q8_0. Other matrices are Q8_0, vectors F32.\n\n"
                      "exit status: 0 success, 1 failure, 2 usage error");
  app.choice("--arch", "ARCH", &arch, {"deepseek4", "kimi-k3", "mixtral"}, "deepseek4 | kimi-k3 | mixtral")
      ->required();
  app.count("--layers", "N", &o.layers, "transformer blocks (default 4)", 1, 4096);
  app.count("--experts", "E", &o.experts, "routed experts per MoE layer (default 8)", 1, 65535);
  app.count("--top-k", "K", &o.top_k, "experts used per token (default 2)", 1, 65535);
  auto* dense_opt = app.count("--dense-layers", "D", &dense,
                              "leading blocks without experts\n(default: 0 deepseek4/mixtral, 1 kimi-k3)", 0, 4096);
  app.count("--embd", "N", &o.embd, "hidden size (default 256; multiple of 32)", 32, 1u << 20);
  app.count("--ff", "N", &o.ff, "expert feed-forward width\n(default 256; kimi-k3: multiple of 256)", 32, 1u << 20);
  app.count("--latent", "N", &o.latent,
            "kimi-k3 only: latent width the experts work in\n(default = --embd; multiple of 256)", 256, 1u << 20);
  app.count("--vocab", "N", &o.vocab, "vocabulary size (default 512)", 3, 1u << 22);
  app.flag("--fused-gate-up", &o.fused, "write blk.N.ffn_gate_up_exps.weight instead of separate gate/up");
  app.count("--shards", "S", &o.shards, "write a gguf-split set OUT-0000k-of-0000S.gguf (S >= 1)", 1, 99999);
  app.count("--seed", "X", &o.seed, "random seed (default 1); output is a pure function of the options", 0,
            UINT64_MAX);
  app.text("-o,--output", "PATH", &o.out, "output file (required)")->required();
  app.flag("-q,--quiet", &o.quiet, "print nothing on success");
  if (auto rc = app.parse(argc, argv)) return *rc;

  if (arch == "deepseek4") { o.arch = Arch::DeepSeek4; o.arch_name = "deepseek4"; }
  else if (arch == "kimi-k3") { o.arch = Arch::KimiK3; o.arch_name = "kimi-k3"; }
  else { o.arch = Arch::Mixtral; o.arch_name = "llama"; }
  o.dense = dense_opt->count() ? int64_t{dense} : (o.arch == Arch::KimiK3 ? 1 : 0);
  if (o.latent == 0) o.latent = o.embd;
  if (o.top_k > o.experts) return app.usage_error("--top-k exceeds --experts");
  if (o.dense >= o.layers) return app.usage_error("--dense-layers must leave at least one MoE layer");
  if (o.embd % 32 || o.ff % 32) return app.usage_error("--embd and --ff must be multiples of 32");
  if (o.arch == Arch::KimiK3 && (o.ff % 256 || o.latent % 256))
    return app.usage_error("kimi-k3 experts are Q2_K/Q3_K: --ff and --latent (default --embd) "
                           "must be multiples of 256");
  if (o.arch != Arch::KimiK3 && o.latent != o.embd) return app.usage_error("--latent is kimi-k3 only");
  Status s = run(o);
  if (!s.ok()) return app.failure(s.error().message);
  return 0;
}
