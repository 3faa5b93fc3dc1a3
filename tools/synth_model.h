// xpack-synth's model description: the resolved options (after --preset and the
// flags that override it) and the list of metadata and tensors each architecture
// writes. The writers (synth_write.cpp) only see a Model, never the options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "gguf/gguf_file.h"

namespace synth {

enum class Arch { DeepSeek4, KimiK3, Mixtral };

// ggml type ids the generators know (lib/gguf/ggml_type.h holds the full table).
constexpr uint32_t F32 = 0, Q8_0 = 8, Q2_K = 10, Q3_K = 11, I32 = 26, MXFP4 = 39;

struct Options {
  Arch arch = Arch::DeepSeek4;
  std::string arch_name;   // the GGUF architecture ("llama" for mixtral)
  std::string model_name;  // general.name
  // Shape shared by every architecture.
  uint32_t layers = 4, experts = 8, top_k = 2, embd = 256, ff = 256, vocab = 512;
  uint32_t dense = 0;     // leading blocks without experts
  uint32_t dense_ff = 0;  // their feed-forward width (kimi-k3.feed_forward_length)
  uint32_t shared = 1;    // shared experts, each ff wide
  uint32_t n_head = 4;
  uint32_t context = 4096;
  float rms_eps = 1e-5f;
  float weights_scale = 1.0f;  // expert_weights_scale
  // deepseek4
  uint32_t head_dim = 64, n_rot = 32, q_lora = 64, o_groups = 2, o_lora = 32, swa = 16;
  uint32_t idx_heads = 4, idx_dim = 32, idx_top_k = 8, hc = 4, hash_layers = 0;
  std::vector<int32_t> compress_ratios;  // one per layer, each 0, 4 or 128
  std::vector<float> swiglu_clamp;       // one per layer (exp and shexp)
  // kimi-k3
  uint32_t latent = 0, kda_head_dim = 64, kv_lora = 64, qk_nope = 32, qk_rope = 16, v_head = 64;
  uint32_t mla_every = 4;  // MLA on every P-th layer and the last, KDA elsewhere
  uint32_t res_block = 2;  // attn_res.block_size
  float situ_beta = 4.0f, situ_linear_beta = 25.0f;
  // Output.
  bool fused = false;  // ffn_gate_up_exps instead of ffn_gate_exps + ffn_up_exps
  bool f32 = false;    // every float tensor F32, as a converter writes them before quantizing
  uint32_t trunk_type = Q8_0;  // the non-expert matrices of a quantized file
  uint32_t shards = 0;
  uint64_t seed = 1;
  // --router-skew A: Zipf exponent of each layer's expert popularity (synth_skew.h);
  // used only when the flag is given (without it the bias and hash tables are random).
  double router_skew = 0.0;
  bool quiet = false, progress = false;
  bool dry_run = false;  // lay the files out and report their sizes, write nothing
  std::string out;
};

struct TensorSpec {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;
  uint32_t int_bound = 0;  // I32 tensors: each row holds distinct values in [0, int_bound)
  // The tensor's whole contents, for the few small tensors --router-skew sets
  // (synth_skew.h); empty means random data from the tensor's stream.
  std::vector<uint8_t> bytes;
};

struct Model {
  std::vector<xpack::gguf::KeyValue> kvs;
  std::vector<TensorSpec> tensors;
  void kv(std::string key, xpack::gguf::Value v) { kvs.push_back({std::move(key), std::move(v)}); }
  void add(std::string name, uint32_t type, std::vector<uint64_t> ne, uint32_t bound = 0) {
    tensors.push_back(TensorSpec{std::move(name), type, std::move(ne), bound, {}});
  }
};

std::string blk(uint32_t layer, const std::string& what);

// general.* and tokenizer.* keys every architecture writes.
void add_common_kvs(Model& m, const Options& o);
// general.file_type / general.quantization_version as llama.cpp's tools leave them:
// a converted F32 file has file_type 0 and no quantization_version; a quantized one
// both, `quant_file_type` being the llama_ftype of the quantization.
void add_file_type(Model& m, const Options& o, uint32_t quant_file_type);
// llama-quantize writes tensors sorted by block, then by name; a converted file keeps
// the converter's order. Shards hold contiguous runs of that order.
void sort_as_quantized(Model& m);

// A MoE block's routed experts in the converter's order: gate (or the fused
// gate_up), down, then up; each of the n experts reads `in` values through an
// `ff`-wide hidden layer.
void add_routed_experts(Model& m, uint32_t layer, bool fused, uint32_t gate_up_type, uint32_t down_type, uint64_t in,
                        uint64_t ff, uint64_t n);
// Its shared experts as one `ff`-wide FFN (gate, down, up) over `embd`.
void add_shared_experts(Model& m, uint32_t layer, uint32_t type, uint64_t embd, uint64_t ff);

Model describe_deepseek4(const Options& o);
Model describe_kimi_k3(const Options& o);
Model describe_mixtral(const Options& o);

// splitmix64 step: the generator behind every random byte of a synthetic model.
uint64_t splitmix64(uint64_t& s);

// Writes the model (one file, or a gguf-split set when o.shards > 0), streaming each
// tensor through one bounded buffer (kChunkBytes), so memory does not grow with the
// model. *written: the paths; *bytes: their total size.
inline constexpr size_t kChunkBytes = size_t{16} << 20;
xpack::Status write_model(const Model& m, const Options& o, std::vector<std::string>* written, uint64_t* bytes);

}  // namespace synth
