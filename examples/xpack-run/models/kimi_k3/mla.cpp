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

#include "../../ops.h"
#include "kimi_k3.h"

namespace xrun::kimi_k3 {

namespace {

// y[t][o] = sum_i W[o][i] x[t][i] for a small float matrix. Plain loops rather
// than backend(): it runs inside parallel_for workers.
void matmul_f32(const float* W, int64_t ne0, int64_t ne1, const float* x, int n, float* y) {
  for (int t = 0; t < n; ++t)
    for (int64_t o = 0; o < ne1; ++o) {
      float s = 0.0f;
      for (int64_t i = 0; i < ne0; ++i) s += W[o * ne0 + i] * x[t * ne0 + i];
      y[t * ne1 + o] = s;
    }
}

}  // namespace

MlaLayer::MlaLayer(const Weights& w, const Hparams& hp, int il) : hp_(hp) {
  const int64_t E = hp.n_embd, H = hp.n_head, hk = hp.head_k_mla, hv = hp.head_v_mla;
  const int64_t kv = hp.kv_lora_rank, nope = hp.qk_nope;

  if (const WeightTensor* qn = w.find(layer_name(il, "attn_q_a_norm.weight"))) {
    if (hp.q_lora_rank <= 0) throw ModelError("kimi-k3: attn_q_a_norm present but attention.q_lora_rank missing");
    q_a_norm_ = to_float(w.get(qn->name, {hp.q_lora_rank}));
    wq_a_ = &w.get(layer_name(il, "attn_q_a.weight"), {E, hp.q_lora_rank});
    wq_b_ = &w.get(layer_name(il, "attn_q_b.weight"), {hp.q_lora_rank, H * hk});
  } else {
    wq_ = &w.get(layer_name(il, "attn_q.weight"), {E, H * hk});
  }
  kv_a_norm_ = to_float(w.get(layer_name(il, "attn_kv_a_norm.weight"), {kv}));
  wkv_a_ = &w.get(layer_name(il, "attn_kv_a_mqa.weight"), {E, kv + hp.qk_rope});

  if (const WeightTensor* kvb = w.find(layer_name(il, "attn_kv_b.weight"))) {
    // Unabsorbed checkpoint: split W_kv_b per head into the absorbed matrices
    // (k rows transposed so they map q_nope into the latent).
    const std::vector<float> m = to_float(w.get(kvb->name, {kv, H * (nope + hv)}));
    k_b_.resize(static_cast<size_t>(H * kv * nope));
    v_b_.resize(static_cast<size_t>(H * hv * kv));
    for (int64_t h = 0; h < H; ++h) {
      const float* head = &m[h * (nope + hv) * kv];
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t c = 0; c < kv; ++c) k_b_[(h * kv + c) * nope + d] = head[d * kv + c];
      std::copy(head + nope * kv, head + (nope + hv) * kv, v_b_.begin() + h * hv * kv);
    }
  } else {
    k_b_ = to_float(w.get(layer_name(il, "attn_k_b.weight"), {nope, kv, H}));
    v_b_ = to_float(w.get(layer_name(il, "attn_v_b.weight"), {kv, hv, H}));
  }
  gate_ = w.find(layer_name(il, "attn_gate.weight"));
  if (gate_) w.get(gate_->name, {E, H * hv});
  wo_ = &w.get(layer_name(il, "attn_output.weight"), {H * hv, E});
}

void MlaLayer::forward(const float* x, int n, MlaCache& cache, float* out) const {
  const int64_t H = hp_.n_head, hk = hp_.head_k_mla, hv = hp_.head_v_mla;
  const int64_t kv = hp_.kv_lora_rank, rope = hp_.qk_rope, nope = hp_.qk_nope;
  const int64_t row = kv + rope;  // one cached position, also one absorbed query
  const float eps = hp_.norm_eps;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hk));

  // --- queries
  std::vector<float> q(static_cast<size_t>(n * H * hk));
  if (wq_a_) {
    std::vector<float> qa(static_cast<size_t>(n * hp_.q_lora_rank));
    matmul(*wq_a_, x, n, qa.data());
    for (int t = 0; t < n; ++t)
      rms_norm_row(&qa[t * hp_.q_lora_rank], q_a_norm_.data(), hp_.q_lora_rank, eps,
                   &qa[t * hp_.q_lora_rank]);
    matmul(*wq_b_, qa.data(), n, q.data());
  } else {
    matmul(*wq_, x, n, q.data());
  }

  // --- the new positions' latent (normed) and rope-part key, appended to the cache
  std::vector<float> kva(static_cast<size_t>(n * row));
  matmul(*wkv_a_, x, n, kva.data());
  const int64_t pos0 = cache.n;
  cache.kv.resize(static_cast<size_t>((pos0 + n) * row));
  for (int t = 0; t < n; ++t) {
    float* dst = &cache.kv[(pos0 + t) * row];
    rms_norm_row(&kva[t * row], kv_a_norm_.data(), kv, eps, dst);
    std::copy(&kva[t * row + kv], &kva[t * row + row], dst + kv);
  }
  cache.n = pos0 + n;

  // --- per head: absorb W_kb into the query, attend over the latents, expand with W_vb
  std::vector<float> o(static_cast<size_t>(n * H * hv));
  parallel_for(H, [&](int64_t h0, int64_t h1) {
    std::vector<float> q_nope(static_cast<size_t>(n * nope)), q_abs(static_cast<size_t>(n * kv));
    std::vector<float> lat(static_cast<size_t>(n * kv)), oh(static_cast<size_t>(n * hv));
    std::vector<float> qrow(static_cast<size_t>(row)), scores(static_cast<size_t>(pos0 + n));
    for (int64_t h = h0; h < h1; ++h) {
      for (int t = 0; t < n; ++t)
        std::copy(&q[(t * H + h) * hk], &q[(t * H + h) * hk + nope], &q_nope[t * nope]);
      matmul_f32(&k_b_[h * kv * nope], nope, kv, q_nope.data(), n, q_abs.data());
      for (int t = 0; t < n; ++t) {
        std::copy(&q_abs[t * kv], &q_abs[t * kv + kv], qrow.begin());
        std::copy(&q[(t * H + h) * hk + nope], &q[(t * H + h) * hk + hk], qrow.begin() + kv);
        const int64_t n_keys = pos0 + t + 1;  // causal
        for (int64_t p = 0; p < n_keys; ++p) {
          const float* key = &cache.kv[p * row];
          float s = 0.0f;
          for (int64_t c = 0; c < row; ++c) s += qrow[c] * key[c];
          scores[p] = s * kq_scale;
        }
        softmax_row(scores.data(), n_keys);
        float* lt = &lat[t * kv];
        std::fill(lt, lt + kv, 0.0f);
        for (int64_t p = 0; p < n_keys; ++p) {
          const float* val = &cache.kv[p * row];
          for (int64_t c = 0; c < kv; ++c) lt[c] += scores[p] * val[c];
        }
      }
      matmul_f32(&v_b_[h * hv * kv], kv, hv, lat.data(), n, oh.data());
      for (int t = 0; t < n; ++t) std::copy(&oh[t * hv], &oh[t * hv + hv], &o[(t * H + h) * hv]);
    }
  });

  // --- K3's sigmoid output gate reads the normed layer input
  if (gate_) {
    std::vector<float> gate(static_cast<size_t>(n * H * hv));
    matmul(*gate_, x, n, gate.data());
    for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[i]);
  }
  matmul(*wo_, o.data(), n, out);
}

}  // namespace xrun::kimi_k3
