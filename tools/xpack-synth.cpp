// xpack-synth: writes synthetic MoE GGUFs shaped like the seed models
// (DeepSeek-V4-Flash, Kimi-K3) or Mixtral, with valid quant blocks and random
// weights, optionally as a gguf-split set. --preset picks the dims of the real
// models or of ../shared/oracle's models; the other flags override them.
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_app.h"
#include "synth_model.h"
#include "synth_skew.h"

namespace {

using synth::Arch;
using synth::Options;

// Compression per layer of DeepSeek-V4-Flash: the first two layers attend through
// the sliding window only, then CSA (4) and HCA (128) alternate.
int32_t ds4_flash_ratio(uint32_t i) { return i < 2 ? 0 : (i % 2 == 0 ? 4 : 128); }

// Values of the oracle models (../shared/oracle/info/*.gen.json), one per layer;
// a deeper model repeats them.
const std::vector<int32_t> kOracleRatios = {0, 4, 128, 4};
const std::vector<float> kOracleClamp = {2.0f, 1.5f, 2.5f, 2.0f};

void preset_oracle_deepseek4(Options& o) {
  o.arch = Arch::DeepSeek4;
  o.layers = 4, o.embd = 64, o.n_head = 4, o.head_dim = 128, o.n_rot = 32, o.q_lora = 32;
  o.o_groups = 2, o.o_lora = 16, o.swa = 16, o.hash_layers = 1;
  o.experts = 16, o.top_k = 4, o.ff = 64, o.shared = 1, o.weights_scale = 1.5f;
  o.idx_heads = 16, o.idx_dim = 64, o.idx_top_k = 8, o.hc = 4, o.rms_eps = 1e-6f, o.context = 4096, o.vocab = 512;
}

void preset_deepseek_v4_flash(Options& o) {
  o.arch = Arch::DeepSeek4;
  o.layers = 43, o.embd = 4096, o.n_head = 64, o.head_dim = 512, o.n_rot = 64, o.q_lora = 1024;
  o.o_groups = 8, o.o_lora = 1024, o.swa = 128, o.hash_layers = 3;
  o.experts = 256, o.top_k = 6, o.ff = 2048, o.shared = 1, o.weights_scale = 1.5f;
  o.idx_heads = 64, o.idx_dim = 128, o.idx_top_k = 512, o.hc = 4, o.rms_eps = 1e-6f, o.context = 1048576;
  o.vocab = 129280;
}

void preset_oracle_kimi_k3(Options& o) {
  o.arch = Arch::KimiK3;
  o.layers = 4, o.embd = 320, o.n_head = 4, o.kda_head_dim = 32, o.q_lora = 64, o.kv_lora = 64;
  o.qk_nope = 32, o.qk_rope = 16, o.v_head = 32, o.dense = 1, o.dense_ff = 256, o.mla_every = 2;
  o.experts = 8, o.top_k = 2, o.ff = 256, o.shared = 2, o.latent = 256, o.weights_scale = 1.0f;
  o.res_block = 2, o.situ_beta = 2.0f, o.situ_linear_beta = 3.0f, o.rms_eps = 1e-5f, o.context = 4096;
  o.vocab = 512;
}

void preset_kimi_k3(Options& o) {
  o.arch = Arch::KimiK3;
  o.layers = 93, o.embd = 7168, o.n_head = 96, o.kda_head_dim = 128, o.q_lora = 1536, o.kv_lora = 512;
  o.qk_nope = 128, o.qk_rope = 64, o.v_head = 128, o.dense = 1, o.dense_ff = 33792, o.mla_every = 4;
  o.experts = 896, o.top_k = 16, o.ff = 3072, o.shared = 2, o.latent = 3584, o.weights_scale = 1.0f;
  o.res_block = 12, o.situ_beta = 4.0f, o.situ_linear_beta = 25.0f, o.rms_eps = 1e-5f, o.context = 1048576;
  o.vocab = 163840;
}

// "4,128,0" -> {4, 128, 0}; nullopt on anything else.
std::optional<std::vector<int32_t>> parse_ratios(const std::string& s) {
  std::vector<int32_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item != "0" && item != "4" && item != "128") return std::nullopt;
    v.push_back(std::stoi(item));
  }
  if (v.empty()) return std::nullopt;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string arch, preset, ratios_text;
  Options given;  // flag values, taken where the flag was given
  xpack::cli::App app(
      "xpack-synth", "xpack-synth (--arch ARCH | --preset NAME) [options] -o OUT.gguf",
      "Writes a synthetic Mixture-of-Experts GGUF with random (valid) weights: every metadata key\n"
      "and tensor llama.cpp reads for the architecture. Random weights do not route like a trained\n"
      "model: numbers measured on them (cache hit rates, SSD bytes) must say so.",
      "Presets: deepseek-v4-flash and kimi-k3 (the published models' dims; --layers N scales\n"
      "depth), oracle-deepseek4 and oracle-kimi-k3 (the dims and hyperparameters of\n"
      "../shared/oracle's models). Flags given with a preset override its values.\n"
      "Tensor types: deepseek4 experts MXFP4; kimi-k3 experts Q2_K gate/up and Q3_K down;\n"
      "mixtral Q8_0. Other matrices Q8_0 (--trunk-type), vectors, routers and mixers F32\n"
      "(--f32: all F32). doc/xpack-synth.md says which tensor has which type.\n\n"
      "exit status: 0 success, 1 failure, 2 usage error");
  app.choice("--arch", "ARCH", &arch, {"deepseek4", "kimi-k3", "mixtral"}, "deepseek4 | kimi-k3 | mixtral");
  app.choice("--preset", "NAME", &preset, {"deepseek-v4-flash", "kimi-k3", "oracle-deepseek4", "oracle-kimi-k3"},
             "deepseek-v4-flash | kimi-k3 | oracle-deepseek4 | oracle-kimi-k3");
  auto* layers = app.count("--layers", "N", &given.layers, "transformer blocks (default 4)", 1, 4096);
  auto* experts = app.count("--experts", "E", &given.experts, "routed experts per MoE layer (default 8)", 1, 65535);
  auto* top_k = app.count("--top-k", "K", &given.top_k, "experts used per token (default 2)", 1, 65535);
  auto* dense = app.count("--dense-layers", "D", &given.dense,
                          "leading blocks without experts\n(default: 0 deepseek4/mixtral, 1 kimi-k3)", 0, 4096);
  auto* embd = app.count("--embd", "N", &given.embd, "hidden size (default 256; multiple of 32)", 32, 1u << 20);
  auto* ff = app.count("--ff", "N", &given.ff, "expert feed-forward width\n(default 256; kimi-k3: multiple of 256)",
                       32, 1u << 20);
  auto* dense_ff = app.count("--dense-ff", "N", &given.dense_ff,
                             "kimi-k3: feed-forward width of the dense blocks (default 2 x --ff)", 32, 1u << 20);
  auto* latent = app.count("--latent", "N", &given.latent,
                           "kimi-k3 only: latent width the experts work in\n(default = --embd; multiple of 256)", 256,
                           1u << 20);
  auto* heads = app.count("--heads", "N", &given.n_head, "attention heads (default 4)", 1, 4096);
  auto* vocab = app.count("--vocab", "N", &given.vocab, "vocabulary size (default 512)", 3, 1u << 22);
  auto* hash = app.count("--hash-layers", "N", &given.hash_layers,
                         "deepseek4: leading layers routed by token id\n(default min(3, --layers))", 0, 4096);
  auto* ratios = app.text("--compress-ratios", "LIST", &ratios_text,
                          "deepseek4: attention compression per layer, 0, 4 or 128\n"
                          "(comma-separated; repeated over the layers)");
  std::string trunk_type = "Q8_0";
  auto* trunk = app.choice("--trunk-type", "TYPE", &trunk_type, {"Q8_0", "MXFP4"},
                           "type of the non-expert matrices of a quantized file\n(default Q8_0; preset kimi-k3: MXFP4)");
  app.flag("--f32", &o.f32, "write every float tensor as F32 (a converted, unquantized file)");
  auto* skew = app.real("--router-skew", "A", &o.router_skew,
                        "deepseek4/kimi-k3: bias the router so each layer's expert popularity\n"
                        "follows a Zipf law of exponent A (0..4, and below what top-k allows;\n"
                        "doc/xpack-synth.md)",
                        0.0, 4.0);
  app.flag("--fused-gate-up", &o.fused, "write blk.N.ffn_gate_up_exps.weight instead of separate gate/up");
  app.count("--shards", "S", &o.shards, "write a gguf-split set OUT-0000k-of-0000S.gguf (S >= 1)", 1, 99999);
  app.count("--seed", "X", &o.seed, "random seed (default 1); output is a pure function of the options", 0,
            UINT64_MAX);
  app.text("-o,--output", "PATH", &o.out, "output file (required)")->required();
  app.flag("--dry-run", &o.dry_run, "check the options and print the size the files would have; write nothing");
  app.flag("--progress", &o.progress, "draw progress on stderr even when it is not a terminal");
  app.flag("-q,--quiet", &o.quiet, "print nothing on success");
  if (auto rc = app.parse(argc, argv)) return *rc;

  if (arch.empty() && preset.empty()) return app.usage_error("--arch is required (or --preset)");
  if (!arch.empty() && !preset.empty()) return app.usage_error("--arch and --preset exclude each other");
  std::vector<int32_t> ratio_cycle;
  std::vector<float> clamp_cycle = {10.0f};
  if (preset == "deepseek-v4-flash") preset_deepseek_v4_flash(o);
  else if (preset == "oracle-deepseek4") preset_oracle_deepseek4(o), ratio_cycle = kOracleRatios, clamp_cycle = kOracleClamp;
  else if (preset == "kimi-k3") preset_kimi_k3(o);
  else if (preset == "oracle-kimi-k3") preset_oracle_kimi_k3(o);
  else if (arch == "deepseek4") o.arch = Arch::DeepSeek4, o.weights_scale = 1.5f;
  else if (arch == "kimi-k3") o.arch = Arch::KimiK3, o.dense = 1, o.shared = 2;
  else o.arch = Arch::Mixtral;
  const bool from_preset = !preset.empty();
  if (layers->count()) o.layers = given.layers;
  if (experts->count()) o.experts = given.experts;
  if (top_k->count()) o.top_k = given.top_k;
  if (dense->count()) o.dense = given.dense;
  if (embd->count()) o.embd = given.embd;
  if (ff->count()) o.ff = given.ff;
  if (heads->count()) o.n_head = given.n_head;
  if (vocab->count()) o.vocab = given.vocab;
  if (latent->count()) o.latent = given.latent;
  if (dense_ff->count()) o.dense_ff = given.dense_ff;
  if (o.latent == 0) o.latent = o.embd;
  if (o.dense_ff == 0) o.dense_ff = 2 * o.ff;
  if (o.arch == Arch::DeepSeek4 && !from_preset) o.hash_layers = std::min<uint32_t>(3, o.layers);
  if (hash->count()) o.hash_layers = given.hash_layers;
  if (o.hash_layers > o.layers) o.hash_layers = o.layers;
  if (ratios->count()) {
    auto r = parse_ratios(ratios_text);
    if (!r) return app.usage_error("--compress-ratios: '" + ratios_text + "' is not a list of 0, 4 and 128");
    ratio_cycle = *r;
  }
  for (uint32_t i = 0; i < o.layers; ++i) {
    int32_t r = !ratio_cycle.empty()     ? ratio_cycle[i % ratio_cycle.size()]
                : preset == "deepseek-v4-flash" ? ds4_flash_ratio(i)
                                                : (i % 2 ? 4 : 0);
    o.compress_ratios.push_back(r);
    o.swiglu_clamp.push_back(clamp_cycle[i % clamp_cycle.size()]);
  }
  // The published Kimi-K3 shards ("MXP4", 1009.51 GB in the seed's report) match an
  // MXFP4 trunk (1017.8 GB here) far better than a Q8_0 one (1047.6 GB); the
  // DeepSeek-V4-Flash blob (155.10 GB) matches Q8_0 (155.18 GB; MXFP4: 151.3 GB).
  if (preset == "kimi-k3" && !trunk->count()) trunk_type = "MXFP4";
  o.trunk_type = trunk_type == "MXFP4" ? synth::MXFP4 : synth::Q8_0;
  if (o.arch == Arch::Mixtral && trunk_type != "Q8_0") return app.usage_error("--trunk-type is deepseek4/kimi-k3 only");
  o.arch_name = o.arch == Arch::DeepSeek4 ? "deepseek4" : o.arch == Arch::KimiK3 ? "kimi-k3" : "llama";
  o.model_name = "xpack-synth-" + (from_preset ? preset : arch) + "-seed" + std::to_string(o.seed);

  if (o.top_k > o.experts) return app.usage_error("--top-k exceeds --experts");
  if (o.dense >= o.layers) return app.usage_error("--dense-layers must leave at least one MoE layer");
  if (o.embd % 32 || o.ff % 32) return app.usage_error("--embd and --ff must be multiples of 32");
  if (o.arch == Arch::KimiK3 && (o.ff % 256 || o.latent % 256))
    return app.usage_error("kimi-k3 experts are Q2_K/Q3_K: --ff and --latent (default --embd) "
                           "must be multiples of 256");
  if (o.arch != Arch::KimiK3 && latent->count()) return app.usage_error("--latent is kimi-k3 only");
  if (o.arch != Arch::KimiK3 && dense_ff->count()) return app.usage_error("--dense-ff is kimi-k3 only");
  if (o.arch != Arch::DeepSeek4 && (hash->count() || ratios->count()))
    return app.usage_error("--hash-layers and --compress-ratios are deepseek4 only");
  if (o.arch == Arch::DeepSeek4 && o.n_head % o.o_groups)
    return app.usage_error("--heads must be a multiple of the output groups (" + std::to_string(o.o_groups) + ")");

  if (skew->count() && o.arch == Arch::Mixtral)
    return app.usage_error("--router-skew is deepseek4/kimi-k3 only (mixtral has no router bias)");

  synth::Model m = o.arch == Arch::DeepSeek4 ? synth::describe_deepseek4(o)
                   : o.arch == Arch::KimiK3  ? synth::describe_kimi_k3(o)
                                             : synth::describe_mixtral(o);
  double beta = 0.0;
  if (skew->count()) {
    auto b = synth::apply_router_skew(m, o);
    if (!b.ok() && b.error().code == XPACK_E_INVALID_ARG) return app.usage_error(b.error().message);
    if (!b.ok()) return app.failure(b.error().message);
    beta = *b;
  }
  std::vector<std::string> written;
  uint64_t bytes = 0;
  xpack::Status s = synth::write_model(m, o, &written, &bytes);
  if (!s.ok()) return app.failure(s.error().message);
  if (!o.quiet) {
    for (const auto& p : written) std::printf("wrote %s\n", p.c_str());
    if (o.dry_run) std::printf("dry run: nothing written\n");
    std::printf("%s: %u layers (%u dense), %u experts, top-%u, %zu tensors, %" PRIu64 " bytes\n",
                o.arch_name.c_str(), o.layers, o.dense, o.experts, o.top_k, m.tensors.size(), bytes);
    if (skew->count()) std::printf("router skew: Zipf exponent %g, exp_probs_b = %.6g x ln w\n", o.router_skew, beta);
  }
  return 0;
}
