// Metadata every synthetic model carries, and the quantizer's tensor order.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "gguf/gguf_writer.h"
#include "synth_model.h"

namespace synth {

namespace val = xpack::gguf::val;

std::string blk(uint32_t layer, const std::string& what) { return "blk." + std::to_string(layer) + "." + what; }

void add_common_kvs(Model& m, const Options& o) {
  m.kv("general.architecture", val::str(o.arch_name));
  m.kv("general.name", val::str(o.model_name));
  m.kv("general.description", val::str("synthetic random weights written by xpack-synth; not a trained model"));
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_type;
  tokens.reserve(o.vocab);
  // With room for them, ids 3..258 are SentencePiece's byte tokens <0x00>..<0xFF>, so any
  // text (a benchmark's prompts) tokenizes by byte fallback into varied ids, in xpack-run and
  // llama.cpp alike, instead of a run of <unk>.
  const bool bytes = o.vocab >= 3 + 256;
  char hex[8];
  for (uint32_t i = 0; i < o.vocab; ++i) {
    if (i < 3) {
      tokens.push_back(i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
    } else if (bytes && i < 3 + 256) {
      std::snprintf(hex, sizeof hex, "<0x%02X>", i - 3);
      tokens.push_back(hex);
    } else {
      tokens.push_back("tok" + std::to_string(i));
    }
    scores.push_back(-static_cast<float>(i));
    token_type.push_back(i < 3 ? 3 : bytes && i < 3 + 256 ? 6 : 1);  // control, byte, normal
  }
  m.kv("tokenizer.ggml.model", val::str("llama"));
  m.kv("tokenizer.ggml.tokens", val::str_array(tokens));
  m.kv("tokenizer.ggml.scores", val::f32_array(scores));
  m.kv("tokenizer.ggml.token_type", val::i32_array(token_type));
  m.kv("tokenizer.ggml.unknown_token_id", val::u32(0));
  m.kv("tokenizer.ggml.bos_token_id", val::u32(1));
  m.kv("tokenizer.ggml.eos_token_id", val::u32(2));
}

void add_file_type(Model& m, const Options& o, uint32_t quant_file_type) {
  m.kv("general.file_type", val::u32(o.f32 ? 0 : quant_file_type));
  if (!o.f32) m.kv("general.quantization_version", val::u32(2));
}

void sort_as_quantized(Model& m) {
  auto layer = [](const std::string& n) -> long {
    return n.rfind("blk.", 0) == 0 ? std::strtol(n.c_str() + 4, nullptr, 10) : -1;
  };
  std::stable_sort(m.tensors.begin(), m.tensors.end(), [&](const TensorSpec& a, const TensorSpec& b) {
    long la = layer(a.name), lb = layer(b.name);
    return la != lb ? la < lb : a.name < b.name;
  });
}

// Mixtral-style llama MoE: the plain deepseek2-family tensor names, no shared expert.
void add_routed_experts(Model& m, uint32_t layer, bool fused, uint32_t gate_up_type, uint32_t down_type, uint64_t in,
                        uint64_t ff, uint64_t n) {
  if (fused) {
    m.add(blk(layer, "ffn_gate_up_exps.weight"), gate_up_type, {in, 2 * ff, n});
  } else {
    m.add(blk(layer, "ffn_gate_exps.weight"), gate_up_type, {in, ff, n});
  }
  m.add(blk(layer, "ffn_down_exps.weight"), down_type, {ff, in, n});
  if (!fused) m.add(blk(layer, "ffn_up_exps.weight"), gate_up_type, {in, ff, n});
}

void add_shared_experts(Model& m, uint32_t layer, uint32_t type, uint64_t embd, uint64_t ff) {
  m.add(blk(layer, "ffn_gate_shexp.weight"), type, {embd, ff});
  m.add(blk(layer, "ffn_down_shexp.weight"), type, {ff, embd});
  m.add(blk(layer, "ffn_up_shexp.weight"), type, {embd, ff});
}

Model describe_mixtral(const Options& o) {
  Model m;
  const std::string& a = o.arch_name;
  const uint64_t E = o.embd, F = o.ff, X = o.experts, V = o.vocab;
  const uint32_t n_head = 4;
  add_common_kvs(m, o);
  m.kv("general.quantization_version", val::u32(2));
  auto akv = [&](const char* k, xpack::gguf::Value v) { m.kv(a + "." + k, std::move(v)); };
  akv("block_count", val::u32(o.layers));
  akv("context_length", val::u32(o.context));
  akv("embedding_length", val::u32(o.embd));
  akv("feed_forward_length", val::u32(2 * o.ff));
  akv("vocab_size", val::u32(o.vocab));
  akv("attention.head_count", val::u32(n_head));
  akv("attention.head_count_kv", val::u32(1));
  akv("attention.layer_norm_rms_epsilon", val::f32(1e-5f));
  akv("expert_count", val::u32(o.experts));
  akv("expert_used_count", val::u32(o.top_k));

  m.add("token_embd.weight", Q8_0, {E, V});
  m.add("output_norm.weight", F32, {E});
  m.add("output.weight", Q8_0, {E, V});
  for (uint32_t i = 0; i < o.layers; ++i) {
    m.add(blk(i, "attn_norm.weight"), F32, {E});
    m.add(blk(i, "ffn_norm.weight"), F32, {E});
    m.add(blk(i, "attn_q.weight"), Q8_0, {E, E});
    m.add(blk(i, "attn_k.weight"), Q8_0, {E, E / n_head});
    m.add(blk(i, "attn_v.weight"), Q8_0, {E, E / n_head});
    m.add(blk(i, "attn_output.weight"), Q8_0, {E, E});
    if (i < o.dense) {
      m.add(blk(i, "ffn_gate.weight"), Q8_0, {E, 2 * F});
      m.add(blk(i, "ffn_up.weight"), Q8_0, {E, 2 * F});
      m.add(blk(i, "ffn_down.weight"), Q8_0, {2 * F, E});
      continue;
    }
    m.add(blk(i, "ffn_gate_inp.weight"), F32, {E, X});
    if (o.fused) {
      m.add(blk(i, "ffn_gate_up_exps.weight"), Q8_0, {E, 2 * F, X});
    } else {
      m.add(blk(i, "ffn_gate_exps.weight"), Q8_0, {E, F, X});
      m.add(blk(i, "ffn_up_exps.weight"), Q8_0, {E, F, X});
    }
    m.add(blk(i, "ffn_down_exps.weight"), Q8_0, {F, E, X});
  }
  return m;
}

}  // namespace synth
