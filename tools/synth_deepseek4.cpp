// DeepSeek-V4-Flash (GGUF arch deepseek4): every key and tensor llama.cpp's fork
// reads, laid out as ../shared/oracle's deepseek4 models (written by its gguf-py)
// and shared/reference/model-architectures.md section 1 describe them.
#include <string>

#include "gguf/gguf_writer.h"
#include "synth_model.h"

namespace synth {

namespace val = xpack::gguf::val;

Model describe_deepseek4(const Options& o) {
  Model m;
  const std::string& a = o.arch_name;
  const uint64_t E = o.embd, F = o.ff, X = o.experts, V = o.vocab, H = o.n_head, D = o.head_dim;
  const uint64_t hc = o.hc, hc_mix = (2 + hc) * hc;  // pre, post and the hc x hc combination
  // Quantized files keep vectors, the router, the mHC mixers and the compressors'
  // positional biases in F32 and store every other matrix as Q8_0 (the trunk of the
  // published MXFP4 GGUF); an F32 file has F32 everywhere.
  const uint32_t mat = o.f32 ? F32 : o.trunk_type, exps = o.f32 ? F32 : MXFP4;

  add_common_kvs(m, o);
  auto akv = [&](const char* k, xpack::gguf::Value v) { m.kv(a + "." + k, std::move(v)); };
  akv("block_count", val::u32(o.layers));
  akv("context_length", val::u32(o.context));
  akv("embedding_length", val::u32(o.embd));
  akv("attention.head_count", val::u32(o.n_head));
  akv("attention.head_count_kv", val::u32(1));  // one shared KV head (MQA)
  akv("rope.scaling.type", val::str("yarn"));
  akv("rope.scaling.factor", val::f32(16.0f));
  akv("rope.scaling.original_context_length", val::u32(65536));
  akv("rope.scaling.yarn_beta_fast", val::f32(32.0f));
  akv("rope.scaling.yarn_beta_slow", val::f32(1.0f));
  akv("rope.freq_base", val::f32(10000.0f));
  akv("attention.layer_norm_rms_epsilon", val::f32(o.rms_eps));
  akv("expert_count", val::u32(o.experts));
  akv("expert_used_count", val::u32(o.top_k));
  akv("expert_gating_func", val::u32(4));  // sqrt(softplus): llama.cpp refuses any other
  akv("attention.key_length", val::u32(o.head_dim));
  akv("attention.value_length", val::u32(o.head_dim));
  add_file_type(m, o, 38);  // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
  akv("rope.dimension_count", val::u32(o.n_rot));
  akv("attention.q_lora_rank", val::u32(o.q_lora));
  akv("attention.sliding_window", val::u32(o.swa));
  akv("expert_feed_forward_length", val::u32(o.ff));
  akv("expert_shared_count", val::u32(o.shared));
  akv("expert_weights_scale", val::f32(o.weights_scale));
  akv("expert_weights_norm", val::boolean(true));
  akv("swiglu_clamp_exp", val::f32_array(o.swiglu_clamp));
  akv("swiglu_clamp_shexp", val::f32_array(o.swiglu_clamp));
  akv("attention.indexer.head_count", val::u32(o.idx_heads));
  akv("attention.indexer.key_length", val::u32(o.idx_dim));
  akv("attention.indexer.top_k", val::u32(o.idx_top_k));
  akv("attention.output_group_count", val::u32(o.o_groups));
  akv("attention.output_lora_rank", val::u32(o.o_lora));
  akv("attention.compress_ratios", val::i32_array(o.compress_ratios));
  akv("attention.compress_rope_freq_base", val::f32(160000.0f));
  akv("hyper_connection.count", val::u32(o.hc));
  akv("hyper_connection.sinkhorn_iterations", val::u32(20));
  akv("hyper_connection.epsilon", val::f32(1e-6f));
  akv("hash_layer_count", val::u32(o.hash_layers));
  akv("embedding_length_out", val::u32(o.hc * o.embd));
  // Not in the real architecture (every DeepSeek-V4 layer is MoE): only for tests
  // that want a dense block in a deepseek4 file.
  if (o.dense > 0) akv("leading_dense_block_count", val::u32(o.dense));

  m.add("token_embd.weight", mat, {E, V});
  m.add("output_norm.weight", F32, {E});
  m.add("output.weight", mat, {E, V});
  m.add("output_hc_fn.weight", F32, {hc * E, hc});
  m.add("output_hc_base.weight", F32, {hc});
  m.add("output_hc_scale.weight", F32, {1});

  for (uint32_t i = 0; i < o.layers; ++i) {
    auto b = [&](const char* what) { return blk(i, what); };
    m.add(b("attn_norm.weight"), F32, {E});
    m.add(b("attn_sinks.weight"), F32, {H});
    m.add(b("attn_q_a.weight"), mat, {E, o.q_lora});
    m.add(b("attn_q_a_norm.weight"), F32, {o.q_lora});
    m.add(b("attn_q_b.weight"), mat, {o.q_lora, H * D});
    m.add(b("attn_kv.weight"), mat, {E, D});
    m.add(b("attn_kv_a_norm.weight"), F32, {D});
    m.add(b("attn_output_a.weight"), mat, {H * D / o.o_groups, uint64_t{o.o_groups} * o.o_lora});
    m.add(b("attn_output_b.weight"), mat, {uint64_t{o.o_groups} * o.o_lora, E});
    for (const char* mix : {"hc_attn", "hc_ffn"}) {
      m.add(blk(i, std::string(mix) + "_fn.weight"), F32, {hc * E, hc_mix});
      m.add(blk(i, std::string(mix) + "_base.weight"), F32, {hc_mix});
      m.add(blk(i, std::string(mix) + "_scale.weight"), F32, {3});
    }
    const uint64_t ratio = static_cast<uint64_t>(o.compress_ratios[i]);
    if (ratio != 0) {
      // CSA (4) compresses two overlapping windows, so its compressor is twice as wide.
      const uint64_t w = ratio == 4 ? 2 * D : D;
      m.add(b("attn_compressor_kv.weight"), mat, {E, w});
      m.add(b("attn_compressor_gate.weight"), mat, {E, w});
      m.add(b("attn_compressor_ape.weight"), F32, {w, ratio});
      m.add(b("attn_compressor_norm.weight"), F32, {D});
    }
    if (ratio == 4) {  // the lightning indexer picks compressed blocks for CSA layers
      const uint64_t ih = o.idx_heads, id = o.idx_dim;
      m.add(b("indexer.proj.weight"), mat, {E, ih});
      m.add(b("indexer.attn_q_b.weight"), mat, {o.q_lora, ih * id});
      m.add(b("indexer_compressor_kv.weight"), mat, {E, 2 * id});
      m.add(b("indexer_compressor_gate.weight"), mat, {E, 2 * id});
      m.add(b("indexer_compressor_ape.weight"), F32, {2 * id, 4});
      m.add(b("indexer_compressor_norm.weight"), F32, {id});
    }
    if (i < o.dense) {
      m.add(b("ffn_norm.weight"), F32, {E});
      m.add(b("ffn_gate.weight"), mat, {E, 2 * F});
      m.add(b("ffn_up.weight"), mat, {E, 2 * F});
      m.add(b("ffn_down.weight"), mat, {2 * F, E});
      continue;
    }
    m.add(b("ffn_gate_inp.weight"), F32, {E, X});
    if (i < o.hash_layers)  // hash layers take their experts from the token id
      m.add(b("ffn_gate_tid2eid.weight"), I32, {o.top_k, V}, o.experts);
    else
      m.add(b("exp_probs_b.bias"), F32, {X});
    m.add(b("ffn_norm.weight"), F32, {E});
    add_routed_experts(m, i, o.fused, exps, exps, E, F, X);
    add_shared_experts(m, i, mat, E, F * o.shared);
  }
  if (!o.f32) sort_as_quantized(m);
  return m;
}

}  // namespace synth
