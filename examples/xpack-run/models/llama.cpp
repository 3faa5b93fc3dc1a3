// llama: the decoder-only transformer of LLaMA / TinyStories (stories260K),
// with llama.cpp's Mixtral form of mixture-of-experts as an option.
//
//   x = token_embd[token]
//   per block:
//     h = x + W_o · Attention(RoPE(W_q · n), RoPE(W_k · n), W_v · n),  n = RMSNorm(x) * attn_norm
//     x = h + FFN(RMSNorm(h) * ffn_norm)
//       dense: W_down · (silu(W_gate · m) ⊙ W_up · m)
//       MoE:   Σ_{e ∈ topk(softmax(W_router · m))} w_e · expert_e(m), w renormalized to sum 1
//   logits = output · (RMSNorm(x) * output_norm)
//
// Attention is causal, grouped-query (n_head_kv K/V heads shared by groups of
// query heads), scaled by 1/sqrt(head_dim); RoPE is the "normal" (GPT-J) style
// that rotates adjacent pairs (2i, 2i+1) of the first n_rot dimensions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "cpu_backend.h"
#include "model.h"
#include "ops.h"

namespace xrun {

namespace {

struct LlamaParams {
  int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  int64_t n_vocab = 0, n_ff = 0;
  int64_t n_expert = 0, n_expert_used = 0;
  float rope_base = 10000.0f, rope_freq_scale = 1.0f, eps = 1e-5f;
};

struct LlamaBlock {
  const WeightTensor *attn_norm, *wq, *wk, *wv, *wo;
  const WeightTensor *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  const WeightTensor* ffn_norm;
  // Dense FFN.
  const WeightTensor *ffn_gate = nullptr, *ffn_up = nullptr, *ffn_down = nullptr;
  // MoE router (experts come from the ExpertSource).
  const WeightTensor* router = nullptr;
  std::vector<float> attn_norm_f, ffn_norm_f, bq_f, bk_f, bv_f, bo_f;
  std::vector<float> k_cache, v_cache;  // [pos][n_head_kv * head_dim], K after RoPE
};

std::vector<float> optional_float(const WeightTensor* t) { return t ? to_float(*t) : std::vector<float>{}; }

class Llama final : public Model {
 public:
  Llama(const Weights& w, ExpertSource* experts) : experts_(experts) {
    auto key = [&](const char* k) { return w.arch_key(k); };
    p_.n_embd = w.get_int(key("embedding_length"));
    p_.n_layer = w.get_int(key("block_count"));
    p_.n_head = w.get_int(key("attention.head_count"));
    p_.n_head_kv = w.get_int(key("attention.head_count_kv"), p_.n_head);
    if (p_.n_embd <= 0 || p_.n_layer <= 0 || p_.n_head <= 0 || p_.n_head_kv <= 0 || p_.n_head % p_.n_head_kv != 0) {
      throw ModelError("llama: inconsistent embedding_length / block_count / head counts");
    }
    p_.head_dim = w.get_int(key("attention.key_length"), p_.n_embd / p_.n_head);
    p_.n_rot = w.get_int(key("rope.dimension_count"), p_.head_dim);
    if (p_.n_rot > p_.head_dim || p_.n_rot % 2 != 0) throw ModelError("llama: bad rope.dimension_count");
    p_.rope_base = static_cast<float>(w.get_float(key("rope.freq_base"), 10000.0));
    // Linear RoPE scaling divides positions by the factor; other kinds are not supported.
    if (w.has(key("rope.scaling.type"))) {
      std::string type = w.get_string(key("rope.scaling.type"));
      if (type == "linear") {
        p_.rope_freq_scale = static_cast<float>(1.0 / w.get_float(key("rope.scaling.factor")));
      } else if (type != "none") {
        throw ModelError("llama: unsupported " + key("rope.scaling.type") + " " + type);
      }
    }
    p_.eps = static_cast<float>(w.get_float(key("attention.layer_norm_rms_epsilon")));
    p_.n_expert = w.get_int(key("expert_count"), 0);
    p_.n_expert_used = w.get_int(key("expert_used_count"), 0);

    const int64_t E = p_.n_embd, D = p_.head_dim;
    token_embd_ = &w.get("token_embd.weight");
    if (token_embd_->ne[0] != E) throw ModelError("tensor token_embd.weight: ne0 != embedding_length");
    p_.n_vocab = token_embd_->ne[1];
    output_norm_ = to_float(w.get("output_norm.weight", {E}));
    // Models with tied embeddings have no output matrix.
    output_ = w.find("output.weight") ? &w.get("output.weight", {E, p_.n_vocab}) : token_embd_;

    blocks_.resize(static_cast<size_t>(p_.n_layer));
    for (int64_t il = 0; il < p_.n_layer; ++il) {
      auto name = [&](const char* t) { return "blk." + std::to_string(il) + "." + t; };
      LlamaBlock& b = blocks_[static_cast<size_t>(il)];
      b.attn_norm = &w.get(name("attn_norm.weight"), {E});
      b.wq = &w.get(name("attn_q.weight"), {E, p_.n_head * D});
      b.wk = &w.get(name("attn_k.weight"), {E, p_.n_head_kv * D});
      b.wv = &w.get(name("attn_v.weight"), {E, p_.n_head_kv * D});
      b.wo = &w.get(name("attn_output.weight"), {p_.n_head * D, E});
      b.bq = w.find(name("attn_q.bias"));
      b.bk = w.find(name("attn_k.bias"));
      b.bv = w.find(name("attn_v.bias"));
      b.bo = w.find(name("attn_output.bias"));
      b.ffn_norm = &w.get(name("ffn_norm.weight"), {E});
      b.attn_norm_f = to_float(*b.attn_norm);
      b.ffn_norm_f = to_float(*b.ffn_norm);
      b.bq_f = optional_float(b.bq);
      b.bk_f = optional_float(b.bk);
      b.bv_f = optional_float(b.bv);
      b.bo_f = optional_float(b.bo);
      b.router = w.find(name("ffn_gate_inp.weight"));
      if (b.router) {
        if (p_.n_expert <= 0 || p_.n_expert_used <= 0 || p_.n_expert_used > p_.n_expert) {
          throw ModelError("llama: MoE block " + std::to_string(il) + " needs " + key("expert_count") + " and " +
                           key("expert_used_count"));
        }
        w.get(name("ffn_gate_inp.weight"), {E, p_.n_expert});
        if (!experts_ || !experts_->has_layer(static_cast<int>(il))) {
          throw ModelError("llama: block " + std::to_string(il) +
                           " routes to experts but no expert source has them (missing " +
                           name("ffn_gate_exps.weight") + "; pass --pack for a converted model)");
        }
        if (experts_->n_experts() != p_.n_expert) {
          throw ModelError("llama: expert source has " + std::to_string(experts_->n_experts()) + " experts, " +
                           key("expert_count") + " says " + std::to_string(p_.n_expert));
        }
      } else {
        b.ffn_gate = &w.get(name("ffn_gate.weight"));
        p_.n_ff = b.ffn_gate->ne[1];
        w.get(name("ffn_gate.weight"), {E, p_.n_ff});
        b.ffn_up = &w.get(name("ffn_up.weight"), {E, p_.n_ff});
        b.ffn_down = &w.get(name("ffn_down.weight"), {p_.n_ff, E});
      }
    }
  }

  int n_vocab() const override { return static_cast<int>(p_.n_vocab); }

  void reset() override {
    for (auto& b : blocks_) {
      b.k_cache.clear();
      b.v_cache.clear();
    }
    n_past_ = 0;
  }

  void eval(const int32_t* tokens, int n, int pos0, float* logits) override {
    if (n <= 0) return;
    if (pos0 != n_past_) {
      throw ModelError("llama: eval at position " + std::to_string(pos0) + " but " + std::to_string(n_past_) +
                       " tokens were evaluated");
    }
    const int64_t E = p_.n_embd;
    std::vector<float> x(static_cast<size_t>(n * E));
    embed(tokens, n, x.data());

    std::vector<float> cur(x.size()), delta(x.size());
    for (int64_t il = 0; il < p_.n_layer; ++il) {
      LlamaBlock& b = blocks_[static_cast<size_t>(il)];
      norm_rows(x.data(), n, b.attn_norm_f.data(), cur.data());
      attention(b, cur.data(), n, pos0, delta.data());
      for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];

      norm_rows(x.data(), n, b.ffn_norm_f.data(), cur.data());
      if (b.router) {
        moe_ffn(b, static_cast<int>(il), cur.data(), n, delta.data());
      } else {
        dense_ffn(b, cur.data(), n, delta.data());
      }
      for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    }
    norm_rows(x.data(), n, output_norm_.data(), cur.data());
    matmul(*output_, cur.data(), n, logits);
    n_past_ = pos0 + n;
  }

 private:
  void embed(const int32_t* tokens, int n, float* x) const {
    const size_t rb = row_bytes(token_embd_->type, p_.n_embd);
    for (int t = 0; t < n; ++t) {
      if (tokens[t] < 0 || tokens[t] >= p_.n_vocab) {
        throw ModelError("token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                         std::to_string(p_.n_vocab));
      }
      dequantize(token_embd_->type, static_cast<const uint8_t*>(token_embd_->data) + rb * size_t(tokens[t]),
                 x + size_t(t) * p_.n_embd, p_.n_embd);
    }
  }

  void norm_rows(const float* x, int n, const float* weight, float* y) const {
    for (int t = 0; t < n; ++t) rms_norm(x + size_t(t) * p_.n_embd, weight, p_.n_embd, p_.eps, y + size_t(t) * p_.n_embd);
  }

  static void add_bias(float* y, int n, int64_t width, const std::vector<float>& bias) {
    if (bias.empty()) return;
    for (int t = 0; t < n; ++t)
      for (int64_t i = 0; i < width; ++i) y[size_t(t) * width + i] += bias[size_t(i)];
  }

  // Rotates pairs (2i, 2i+1), i < n_rot/2, of every head by pos * base^(-2i/n_rot).
  void rope(float* v, int n_heads, int64_t pos) const {
    const float theta_scale = std::pow(p_.rope_base, -2.0f / static_cast<float>(p_.n_rot));
    for (int h = 0; h < n_heads; ++h) {
      float* hv = v + size_t(h) * p_.head_dim;
      float theta = static_cast<float>(pos) * p_.rope_freq_scale;
      for (int64_t i = 0; i < p_.n_rot; i += 2) {
        const float c = std::cos(theta), s = std::sin(theta);
        const float a = hv[i], b = hv[i + 1];
        hv[i] = a * c - b * s;
        hv[i + 1] = a * s + b * c;
        theta *= theta_scale;
      }
    }
  }

  void attention(LlamaBlock& b, const float* cur, int n, int pos0, float* out) {
    const int64_t D = p_.head_dim, HQ = p_.n_head, HK = p_.n_head_kv;
    const int64_t q_w = HQ * D, kv_w = HK * D;
    std::vector<float> q(size_t(n) * q_w), k(size_t(n) * kv_w), v(size_t(n) * kv_w);
    matmul(*b.wq, cur, n, q.data());
    matmul(*b.wk, cur, n, k.data());
    matmul(*b.wv, cur, n, v.data());
    add_bias(q.data(), n, q_w, b.bq_f);
    add_bias(k.data(), n, kv_w, b.bk_f);
    add_bias(v.data(), n, kv_w, b.bv_f);
    for (int t = 0; t < n; ++t) {
      rope(q.data() + size_t(t) * q_w, static_cast<int>(HQ), pos0 + t);
      rope(k.data() + size_t(t) * kv_w, static_cast<int>(HK), pos0 + t);
    }
    const size_t n_kv = size_t(pos0 + n);
    b.k_cache.resize(n_kv * kv_w);
    b.v_cache.resize(n_kv * kv_w);
    std::copy(k.begin(), k.end(), b.k_cache.begin() + ptrdiff_t(size_t(pos0) * kv_w));
    std::copy(v.begin(), v.end(), b.v_cache.begin() + ptrdiff_t(size_t(pos0) * kv_w));

    std::vector<float> attn(size_t(n) * q_w);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int64_t group = HQ / HK;
    parallel_for_work(int64_t(n) * HQ, int64_t(n_kv) * D * 2, [&](int64_t begin, int64_t end) {
      std::vector<float> score(n_kv);
      for (int64_t job = begin; job < end; ++job) {
        const int t = static_cast<int>(job / HQ);
        const int64_t h = job % HQ, hk = h / group;
        const float* qh = q.data() + size_t(t) * q_w + size_t(h) * D;
        const int64_t visible = pos0 + t + 1;  // causal: keys 0..pos0+t
        for (int64_t j = 0; j < visible; ++j) {
          const float* kj = b.k_cache.data() + size_t(j) * kv_w + size_t(hk) * D;
          float s = 0.0f;
          for (int64_t d = 0; d < D; ++d) s += qh[d] * kj[d];
          score[size_t(j)] = s * scale;
        }
        softmax_inplace(score.data(), visible);
        float* oh = attn.data() + size_t(t) * q_w + size_t(h) * D;
        std::fill(oh, oh + D, 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          const float* vj = b.v_cache.data() + size_t(j) * kv_w + size_t(hk) * D;
          const float pj = score[size_t(j)];
          for (int64_t d = 0; d < D; ++d) oh[d] += pj * vj[d];
        }
      }
    });
    matmul(*b.wo, attn.data(), n, out);
    add_bias(out, n, p_.n_embd, b.bo_f);
  }

  void dense_ffn(const LlamaBlock& b, const float* cur, int n, float* out) const {
    const int64_t F = b.ffn_gate->ne[1];
    std::vector<float> g(size_t(n) * F), u(size_t(n) * F);
    matmul(*b.ffn_gate, cur, n, g.data());
    matmul(*b.ffn_up, cur, n, u.data());
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
    matmul(*b.ffn_down, g.data(), n, out);
  }

  // Routing (per token): softmax over the router logits, the top-k experts
  // (ties to the lower id), their probabilities renormalized to sum 1.
  // Compute (per batch): tokens are grouped by expert so each expert's weights
  // are fetched once and applied to all its tokens as one matmul.
  void moe_ffn(const LlamaBlock& b, int il, const float* cur, int n, float* out) {
    const int64_t E = p_.n_embd, NE = p_.n_expert, K = p_.n_expert_used;
    std::vector<float> probs(size_t(n) * NE);
    matmul(*b.router, cur, n, probs.data());
    std::map<int32_t, std::vector<std::pair<int, float>>> by_expert;  // expert -> (token, weight)
    std::vector<int32_t> order(static_cast<size_t>(NE));
    for (int t = 0; t < n; ++t) {
      float* pt = probs.data() + size_t(t) * NE;
      softmax_inplace(pt, NE);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return pt[a] > pt[c]; });
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += pt[order[size_t(k)]];
      sum = std::max(sum, 6.103515625e-5f);  // llama.cpp's guard against a zero sum
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = order[size_t(k)];
        by_expert[e].emplace_back(t, pt[e] / sum);
      }
    }
    std::vector<int32_t> ids;
    for (const auto& kv : by_expert) ids.push_back(kv.first);
    std::fill(out, out + size_t(n) * E, 0.0f);
    std::vector<float> xs, g, u, y;
    // Experts in ascending id order, each added into the output as it is computed.
    experts_->for_each(il, ids.data(), static_cast<int>(ids.size()), [&](const ExpertWeights& ew) {
      const auto& rows = by_expert[ew.expert];
      const int m = static_cast<int>(rows.size());
      xs.resize(size_t(m) * E);
      for (int r = 0; r < m; ++r) std::memcpy(&xs[size_t(r) * E], cur + size_t(rows[r].first) * E, sizeof(float) * E);
      expert_ffn(ew, il, xs.data(), m, g, u, y);
      for (int r = 0; r < m; ++r) {
        float* o = out + size_t(rows[r].first) * E;
        const float wgt = rows[r].second;
        for (int64_t d = 0; d < E; ++d) o[d] += wgt * y[size_t(r) * E + d];
      }
    });
  }

  void expert_ffn(const ExpertWeights& ew, int il, const float* xs, int m, std::vector<float>& g,
                  std::vector<float>& u, std::vector<float>& y) const {
    const int64_t E = p_.n_embd;
    const ExpertMatrix* down = ew.role("down");
    if (!down || down->ne1 != E) {
      throw ModelError("llama: expert " + std::to_string(ew.expert) + " of block " + std::to_string(il) +
                       " has no usable down projection");
    }
    const int64_t F = down->ne0;
    g.resize(size_t(m) * F);
    u.resize(size_t(m) * F);
    if (const ExpertMatrix* gu = ew.role("gate_up")) {
      // Fused form: the first F outputs are the gate, the next F the up projection.
      if (gu->ne0 != E || gu->ne1 != 2 * F) throw ModelError("llama: ffn_gate_up_exps has an unexpected shape");
      std::vector<float> both(size_t(m) * 2 * F);
      matmul(*gu, xs, m, both.data());
      for (int r = 0; r < m; ++r) {
        std::memcpy(&g[size_t(r) * F], &both[size_t(r) * 2 * F], sizeof(float) * F);
        std::memcpy(&u[size_t(r) * F], &both[size_t(r) * 2 * F + F], sizeof(float) * F);
      }
    } else {
      const ExpertMatrix* gate = ew.role("gate");
      const ExpertMatrix* up = ew.role("up");
      if (!gate || !up || gate->ne0 != E || up->ne0 != E || gate->ne1 != F || up->ne1 != F) {
        throw ModelError("llama: expert gate/up of block " + std::to_string(il) + " missing or misshapen");
      }
      matmul(*gate, xs, m, g.data());
      matmul(*up, xs, m, u.data());
    }
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
    y.resize(size_t(m) * E);
    matmul(*down, g.data(), m, y.data());
  }

  LlamaParams p_;
  ExpertSource* experts_;
  const WeightTensor* token_embd_ = nullptr;
  const WeightTensor* output_ = nullptr;
  std::vector<float> output_norm_;
  std::vector<LlamaBlock> blocks_;
  int n_past_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_llama(const Weights& w, ExpertSource* experts) {
  return std::make_unique<Llama>(w, experts);
}

}  // namespace xrun
