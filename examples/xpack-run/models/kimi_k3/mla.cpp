// Multi-head latent attention of Kimi-K3, as llama.cpp's kimi-k3 graph computes it:
//
//   q         = W_qb(rms_norm(W_qa x) * q_a_norm)        (or W_q x without q LoRA)
//               per head [q_nope | q_rope]
//   [c | kr]  = W_kv_a_mqa x;  c = rms_norm(c) * kv_a_norm  one latent per token (MQA)
//   score     = ([W_kb q_nope | q_rope] . [c | kr]) / sqrt(key_length_mla)
//   o_h       = W_vb softmax(score) c                         absorbed form
//   out       = W_o(o * sigmoid(W_gate x))                    K3's output gate
//
// K3's MLA is nope-only: no RoPE anywhere, the "rope" part of q and k is a plain
// dot product. The cache holds [c | kr] per position, F32 like the oracle's KV cache.
#include <cmath>
#include <vector>

#include "../../dequant.h"
#include "kimi_k3.h"
#include "xpack/xpack.h"

namespace xrun::kimi_k3 {

namespace {

constexpr uint32_t kF32 = XPACK_TYPE_F32;

// Dequantized on the host: the absorbed matrices are rearranged before upload.
std::vector<float> host_floats(const WeightTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.ne[0] * t.rows()));
  const size_t rb = row_bytes(t.type, t.ne[0]);
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize(t.type, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r) * rb, &out[r * t.ne[0]], t.ne[0]);
  return out;
}

}  // namespace

MlaLayer::MlaLayer(const Weights& w, const Hparams& hp, Backend& be, KimiOps& ops, int il)
    : hp_(hp), be_(be), ops_(ops) {
  const int64_t E = hp.n_embd, H = hp.n_head, hk = hp.head_k_mla, hv = hp.head_v_mla;
  const int64_t kv = hp.kv_lora_rank, nope = hp.qk_nope;

  if (const WeightTensor* qn = w.find(layer_name(il, "attn_q_a_norm.weight"))) {
    if (hp.q_lora_rank <= 0) throw ModelError("kimi-k3: attn_q_a_norm present but attention.q_lora_rank missing");
    q_a_norm_ = float_weight(be, w.get(qn->name, {hp.q_lora_rank}));
    wq_a_ = be.weight(w.get(layer_name(il, "attn_q_a.weight"), {E, hp.q_lora_rank}));
    wq_b_ = be.weight(w.get(layer_name(il, "attn_q_b.weight"), {hp.q_lora_rank, H * hk}));
    q_lora_ = true;
  } else {
    wq_ = be.weight(w.get(layer_name(il, "attn_q.weight"), {E, H * hk}));
  }
  kv_a_norm_ = float_weight(be, w.get(layer_name(il, "attn_kv_a_norm.weight"), {kv}));
  // Rows [0, kv) of attn_kv_a_mqa make the latent, the rest the rope-part key.
  const Tensor wkv_a = be.weight(w.get(layer_name(il, "attn_kv_a_mqa.weight"), {E, kv + hp.qk_rope}));
  wkv_latent_ = wkv_a.row_range(0, kv);
  wkv_rope_ = wkv_a.row_range(kv, hp.qk_rope);

  if (const WeightTensor* kvb = w.find(layer_name(il, "attn_kv_b.weight"))) {
    // Unabsorbed checkpoint: split W_kv_b per head into the absorbed matrices
    // (k rows transposed so they map q_nope into the latent).
    const std::vector<float> m = host_floats(w.get(kvb->name, {kv, H * (nope + hv)}));
    std::vector<float> k_b(static_cast<size_t>(H * kv * nope)), v_b(static_cast<size_t>(H * hv * kv));
    for (int64_t h = 0; h < H; ++h) {
      const float* head = &m[h * (nope + hv) * kv];
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t c = 0; c < kv; ++c) k_b[(h * kv + c) * nope + d] = head[d * kv + c];
      std::copy(head + nope * kv, head + (nope + hv) * kv, v_b.begin() + h * hv * kv);
    }
    k_b_ = be.upload(kF32, k_b.data(), nope, H * kv);
    v_b_ = be.upload(kF32, v_b.data(), kv, H * hv);
  } else {
    k_b_ = float_weight(be, w.get(layer_name(il, "attn_k_b.weight"), {nope, kv, H}));
    v_b_ = float_weight(be, w.get(layer_name(il, "attn_v_b.weight"), {kv, hv, H}));
  }
  if (const WeightTensor* gate = w.find(layer_name(il, "attn_gate.weight"))) {
    gate_ = be.weight(w.get(gate->name, {E, H * hv}));
    has_gate_ = true;
  }
  wo_ = be.weight(w.get(layer_name(il, "attn_output.weight"), {H * hv, E}));
}

void MlaLayer::init_cache(MlaCache& cache) const {
  cache.latent = be_.alloc(kF32, hp_.kv_lora_rank, 0);
  cache.rope_key = be_.alloc(kF32, hp_.qk_rope, 0);
  cache.n = 0;
}

void MlaLayer::forward(const Tensor& x, MlaCache& cache, const Tensor& out) const {
  const int64_t n = x.rows(), H = hp_.n_head, hk = hp_.head_k_mla, hv = hp_.head_v_mla;
  const int64_t rope = hp_.qk_rope;
  const float eps = hp_.norm_eps;

  // --- every projection of the input, in one call: the query (or its low
  // rank), the new positions' latent and rope-part key (in their places in the
  // cache), K3's output gate
  const int64_t pos0 = cache.n;
  reserve_rows(be_, cache.latent, pos0 + n);
  reserve_rows(be_, cache.rope_key, pos0 + n);
  const Tensor q = be_.empty(kF32, H * hk, n);
  const Tensor qa = q_lora_ ? be_.empty(kF32, hp_.q_lora_rank, n) : Tensor{};
  const Tensor latent = cache.latent.row_range(pos0, n), rope_key = cache.rope_key.row_range(pos0, n);
  const Tensor gate = has_gate_ ? be_.empty(kF32, H * hv, n) : Tensor{};
  std::vector<Backend::Product> from_x = {{&wkv_latent_, &latent}};
  from_x.push_back(q_lora_ ? Backend::Product{&wq_a_, &qa} : Backend::Product{&wq_, &q});
  if (rope > 0) from_x.push_back({&wkv_rope_, &rope_key});
  if (has_gate_) from_x.push_back({&gate_, &gate});
  be_.shared_input_matmul(x, from_x);

  // --- queries
  if (q_lora_) {
    be_.rms_norm(qa, &q_a_norm_, eps, qa);
    be_.matmul(wq_b_, qa, q);
  }

  // --- the new positions' latent (normed) and rope-part key, appended to the cache
  be_.rms_norm(latent, &kv_a_norm_, eps, latent);
  cache.n = pos0 + n;

  // --- per head: absorb W_kb into the query, attend over the latents, expand with W_vb
  const Tensor o = be_.empty(kF32, H * hv, n);  // every element written
  ops_.mla_attention(q, cache.latent.row_range(0, cache.n), cache.rope_key.row_range(0, cache.n), k_b_, v_b_, H, pos0,
                     1.0f / std::sqrt(static_cast<float>(hk)), o);

  // --- K3's sigmoid output gate reads the normed layer input
  if (has_gate_) {
    be_.unary(Unary::sigmoid, gate, gate);
    be_.mul(o, gate, o);
  }
  be_.matmul(wo_, o, out);
}

}  // namespace xrun::kimi_k3
