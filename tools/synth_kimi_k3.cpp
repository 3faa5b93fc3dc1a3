// Kimi-K3 (GGUF arch kimi-k3): every key and tensor llama.cpp's fork reads, laid
// out as ../shared/oracle's kimi-k3 models (written by its gguf-py) and
// shared/reference/model-architectures.md section 2 describe them: KDA layers with
// MLA every mla_every-th layer and on the last, latent MoE, attn_res score vectors.
#include <string>

#include "gguf/gguf_writer.h"
#include "synth_model.h"

namespace synth {

namespace val = xpack::gguf::val;

namespace {
bool is_mla(const Options& o, uint32_t i) { return (i + 1) % o.mla_every == 0 || i + 1 == o.layers; }
}  // namespace

Model describe_kimi_k3(const Options& o) {
  Model m;
  const std::string& a = o.arch_name;
  const uint64_t E = o.embd, F = o.ff, X = o.experts, V = o.vocab, H = o.n_head, L = o.latent;
  const uint64_t d_inner = H * o.kda_head_dim;
  // Quantized: experts Q2_K (gate, up) and Q3_K (down) as the published Kimi-K3 GGUF,
  // every other matrix Q8_0, vectors and the router F32. F32 files: F32 everywhere.
  const uint32_t mat = o.f32 ? F32 : o.trunk_type, gate_up = o.f32 ? F32 : Q2_K, down = o.f32 ? F32 : Q3_K;

  add_common_kvs(m, o);
  auto akv = [&](const char* k, xpack::gguf::Value v) { m.kv(a + "." + k, std::move(v)); };
  akv("block_count", val::u32(o.layers));
  akv("context_length", val::u32(o.context));
  akv("embedding_length", val::u32(o.embd));
  akv("feed_forward_length", val::u32(o.dense_ff));
  akv("attention.head_count", val::u32(o.n_head));
  akv("attention.layer_norm_rms_epsilon", val::f32(o.rms_eps));
  akv("expert_count", val::u32(o.experts));
  akv("expert_used_count", val::u32(o.top_k));
  add_file_type(m, o, 7);  // LLAMA_FTYPE_MOSTLY_Q8_0, the trunk's type
  akv("vocab_size", val::u32(o.vocab));
  // 0 marks a KDA (recurrent) layer; MLA layers keep one latent KV head.
  std::vector<int32_t> kv_heads;
  for (uint32_t i = 0; i < o.layers; ++i) kv_heads.push_back(is_mla(o, i) ? 1 : 0);
  akv("attention.head_count_kv", val::i32_array(kv_heads));
  akv("ssm.conv_kernel", val::u32(4));
  akv("kda.head_dim", val::u32(o.kda_head_dim));
  akv("kda.gate_lower_bound", val::f32(-5.0f));
  akv("attention.q_lora_rank", val::u32(o.q_lora));
  akv("attention.kv_lora_rank", val::u32(o.kv_lora));
  akv("rope.dimension_count", val::u32(o.qk_rope));
  akv("attention.key_length", val::u32(o.kv_lora + o.qk_rope));
  akv("attention.key_length_mla", val::u32(o.qk_nope + o.qk_rope));
  akv("attention.value_length_mla", val::u32(o.v_head));
  akv("expert_feed_forward_length", val::u32(o.ff));
  akv("expert_shared_count", val::u32(o.shared));
  akv("leading_dense_block_count", val::u32(o.dense));
  akv("expert_weights_scale", val::f32(o.weights_scale));
  akv("expert_weights_norm", val::boolean(true));
  akv("expert_gating_func", val::u32(2));  // sigmoid
  akv("expert_latent_length", val::u32(o.latent));
  akv("activation.situ_beta", val::f32(o.situ_beta));
  akv("activation.situ_linear_beta", val::f32(o.situ_linear_beta));
  akv("attn_res.block_size", val::u32(o.res_block));

  m.add("token_embd.weight", mat, {E, V});
  m.add("output_norm.weight", F32, {E});
  m.add("output.weight", mat, {E, V});
  m.add("output_res_score.weight", F32, {E});
  // The converter writes the short convolutions 4-D ({d_conv, 1, d_inner, 1});
  // llama-quantize drops the trailing 1.
  auto conv_ne = [&]() -> std::vector<uint64_t> {
    if (o.f32) return {4, 1, d_inner, 1};
    return {4, 1, d_inner};
  };

  for (uint32_t i = 0; i < o.layers; ++i) {
    auto b = [&](const char* what) { return blk(i, what); };
    m.add(b("attn_norm.weight"), F32, {E});
    m.add(b("ffn_norm.weight"), F32, {E});
    m.add(b("attn_res_score.weight"), F32, {E});
    m.add(b("ffn_res_score.weight"), F32, {E});
    if (!is_mla(o, i)) {
      const uint64_t hd = o.kda_head_dim;
      for (const char* c : {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"})
        m.add(b(c), F32, conv_ne());
      m.add(b("attn_q.weight"), mat, {E, d_inner});
      m.add(b("attn_k.weight"), mat, {E, d_inner});
      m.add(b("attn_v.weight"), mat, {E, d_inner});
      m.add(b("ssm_f_a.weight"), mat, {E, hd});
      m.add(b("ssm_f_b.weight"), mat, {hd, d_inner});
      m.add(b("ssm_beta.weight"), mat, {E, H});
      m.add(b("ssm_a"), F32, {H});
      m.add(b("ssm_dt.bias"), F32, {d_inner});
      m.add(b("ssm_g.weight"), mat, {E, d_inner});
      m.add(b("ssm_norm.weight"), F32, {hd});
      m.add(b("attn_output.weight"), mat, {d_inner, E});
    } else {
      m.add(b("attn_q_a_norm.weight"), F32, {o.q_lora});
      m.add(b("attn_kv_a_norm.weight"), F32, {o.kv_lora});
      m.add(b("attn_q_a.weight"), mat, {E, o.q_lora});
      m.add(b("attn_q_b.weight"), mat, {o.q_lora, H * (o.qk_nope + o.qk_rope)});
      m.add(b("attn_kv_a_mqa.weight"), mat, {E, uint64_t{o.kv_lora} + o.qk_rope});
      m.add(b("attn_k_b.weight"), mat, {o.qk_nope, o.kv_lora, H});
      m.add(b("attn_v_b.weight"), mat, {o.kv_lora, o.v_head, H});
      m.add(b("attn_gate.weight"), mat, {E, H * o.v_head});
      m.add(b("attn_output.weight"), mat, {H * o.v_head, E});
    }
    if (i < o.dense) {
      m.add(b("ffn_gate.weight"), mat, {E, o.dense_ff});
      m.add(b("ffn_down.weight"), mat, {o.dense_ff, E});
      m.add(b("ffn_up.weight"), mat, {E, o.dense_ff});
      continue;
    }
    m.add(b("ffn_gate_inp.weight"), F32, {E, X});
    m.add(b("exp_probs_b.bias"), F32, {X});
    add_routed_experts(m, i, o.fused, gate_up, down, L, F, X);  // in the latent width
    m.add(b("ffn_routed_down.weight"), mat, {E, L});
    m.add(b("ffn_routed_up.weight"), mat, {L, E});
    m.add(b("ffn_routed_norm.weight"), F32, {L});
    add_shared_experts(m, i, mat, E, F * o.shared);
  }
  if (!o.f32) sort_as_quantized(m);
  return m;
}

}  // namespace synth
