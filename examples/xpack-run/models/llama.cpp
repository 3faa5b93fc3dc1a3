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
// With --prefetch-next a MoE block guesses the next MoE block's experts
// (next_layer_guess.h) from its own FFN input.
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "../backend.h"
#include "../gated_ffn.h"
#include "../model.h"
#include "../routed_experts.h"
#include "xpack/xpack.h"

namespace xrun {

namespace {

struct LlamaParams {
  int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  int64_t n_vocab = 0, n_ff = 0;
  int64_t n_expert = 0, n_expert_used = 0;
  float rope_base = 10000.0f, rope_freq_scale = 1.0f, eps = 1e-5f;
};

struct LlamaBlock {
  Tensor attn_norm, wq, wk, wv, wo;
  std::optional<Tensor> bq, bk, bv, bo;
  Tensor ffn_norm;
  GatedMatrices ffn;          // dense blocks
  std::optional<Tensor> router;  // MoE blocks (experts come from the ExpertSource)
  GuessRouter guess;             // the router again, for the block before's guess (--prefetch-next)
  Tensor k_cache, v_cache;    // [capacity][n_head_kv * head_dim], K after RoPE
};

constexpr uint32_t kF32 = XPACK_TYPE_F32;

class Llama final : public Model {
 public:
  Llama(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o) : be_(be), experts_(experts) {
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
    rope_.head_dim = p_.head_dim;
    rope_.angles.n_dims = static_cast<int>(p_.n_rot);
    rope_.angles.freq_base = p_.rope_base;
    rope_.angles.freq_scale = p_.rope_freq_scale;

    const int64_t E = p_.n_embd, D = p_.head_dim;
    const WeightTensor& embd = w.get("token_embd.weight");
    if (embd.ne[0] != E) throw ModelError("tensor token_embd.weight: ne0 != embedding_length");
    p_.n_vocab = embd.ne[1];
    token_embd_ = be_.weight(embd);
    output_norm_ = float_weight(be_, w.get("output_norm.weight", {E}));
    // Models with tied embeddings have no output matrix.
    output_ = w.find("output.weight") ? be_.weight(w.get("output.weight", {E, p_.n_vocab})) : token_embd_;

    blocks_.resize(static_cast<size_t>(p_.n_layer));
    auto optional_float = [&](const std::string& name) {
      const WeightTensor* t = w.find(name);
      return t ? std::optional<Tensor>(float_weight(be_, *t)) : std::nullopt;
    };
    for (int64_t il = 0; il < p_.n_layer; ++il) {
      auto name = [&](const char* t) { return "blk." + std::to_string(il) + "." + t; };
      LlamaBlock& b = blocks_[static_cast<size_t>(il)];
      b.attn_norm = float_weight(be_, w.get(name("attn_norm.weight"), {E}));
      b.wq = be_.weight(w.get(name("attn_q.weight"), {E, p_.n_head * D}));
      b.wk = be_.weight(w.get(name("attn_k.weight"), {E, p_.n_head_kv * D}));
      b.wv = be_.weight(w.get(name("attn_v.weight"), {E, p_.n_head_kv * D}));
      b.wo = be_.weight(w.get(name("attn_output.weight"), {p_.n_head * D, E}));
      b.bq = optional_float(name("attn_q.bias"));
      b.bk = optional_float(name("attn_k.bias"));
      b.bv = optional_float(name("attn_v.bias"));
      b.bo = optional_float(name("attn_output.bias"));
      b.ffn_norm = float_weight(be_, w.get(name("ffn_norm.weight"), {E}));
      if (w.find(name("ffn_gate_inp.weight"))) {
        if (p_.n_expert <= 0 || p_.n_expert_used <= 0 || p_.n_expert_used > p_.n_expert) {
          throw ModelError("llama: MoE block " + std::to_string(il) + " needs " + key("expert_count") + " and " +
                           key("expert_used_count"));
        }
        b.router = be_.weight(w.get(name("ffn_gate_inp.weight"), {E, p_.n_expert}));
        // softmax keeps each row's order, and there is no bias: the raw products rank as the router does.
        b.guess = {static_cast<int>(il), *b.router, GuessRouter::Gating::none, {}};
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
        p_.n_ff = w.get(name("ffn_gate.weight")).ne[1];
        b.ffn.gate = be_.weight(w.get(name("ffn_gate.weight"), {E, p_.n_ff}));
        b.ffn.up = be_.weight(w.get(name("ffn_up.weight"), {E, p_.n_ff}));
        b.ffn.down = be_.weight(w.get(name("ffn_down.weight"), {p_.n_ff, E}));
      }
    }
    if (o.prefetch_next > 0 && p_.n_expert == 0)
      throw ModelError("--prefetch-next " + std::to_string(o.prefetch_next) + ": this model has no routed experts to guess");
    guesser_ = make_guesser(o, p_.n_expert);
    reset();
  }

  int n_vocab() const override { return static_cast<int>(p_.n_vocab); }

  nlohmann::ordered_json counters_json() const override {
    return guesser_ ? guesser_->counters_json() : nlohmann::ordered_json::object();
  }

  void reset() override {
    const int64_t kv_w = p_.n_head_kv * p_.head_dim;
    for (auto& b : blocks_) {
      b.k_cache = be_.alloc(kF32, kv_w, 0);
      b.v_cache = be_.alloc(kF32, kv_w, 0);
    }
    n_past_ = 0;
  }

  void eval(const int32_t* tokens, int n, int pos0, float* logits, LogitRows rows) override {
    if (n <= 0) return;
    check_eval("llama", tokens, n, pos0, n_past_, p_.n_vocab);
    be_.capture_until_download(n, /*step_start=*/true);
    const int64_t E = p_.n_embd;
    const Tensor ids = be_.upload(XPACK_TYPE_I32, tokens, 1, n);
    const Tensor x = be_.alloc(kF32, E, n), cur = be_.alloc(kF32, E, n), delta = be_.alloc(kF32, E, n);
    be_.get_rows(token_embd_, ids, x);
    for (int64_t il = 0; il < p_.n_layer; ++il) {
      LlamaBlock& b = blocks_[static_cast<size_t>(il)];
      be_.rms_norm(x, &b.attn_norm, p_.eps, cur);
      attention(b, cur, pos0, delta);
      be_.add(x, delta, x);

      NextGuess next{guesser_.get(), nullptr, {}};
      if (guesser_ && b.router && il + 1 < p_.n_layer && blocks_[size_t(il + 1)].router) {
        const LlamaBlock& nb = blocks_[size_t(il + 1)];
        next.router = &nb.guess;
        if (guesser_->state() == GuessState::renormed) {
          next.state = be_.alloc(kF32, E, n);
          be_.rms_norm(x, &nb.ffn_norm, p_.eps, next.state);
        }
      }
      be_.rms_norm(x, &b.ffn_norm, p_.eps, cur);
      if (next.router && guesser_->state() == GuessState::moe_input) next.state = cur;
      if (b.router) {
        moe_ffn(b, static_cast<int>(il), cur, delta, next);
      } else {
        gated_ffn(be_, b.ffn, swiglu_, cur, delta);
      }
      be_.add(x, delta, x);
    }
    be_.rms_norm(x, &output_norm_, p_.eps, cur);
    download_logits(be_, output_, cur, logits, rows);
    n_past_ = pos0 + n;
  }

 private:
  void project(const Tensor& w, const std::optional<Tensor>& bias, const Tensor& x, const Tensor& y) {
    be_.matmul(w, x, y);
    if (bias) be_.add(y, *bias, y);
  }

  void attention(LlamaBlock& b, const Tensor& cur, int pos0, const Tensor& out) {
    const int64_t n = cur.rows(), q_w = p_.n_head * p_.head_dim, kv_w = p_.n_head_kv * p_.head_dim;
    const Tensor q = be_.alloc(kF32, q_w, n), k = be_.alloc(kF32, kv_w, n), v = be_.alloc(kF32, kv_w, n);
    be_.shared_input_matmul(cur, {{&b.wq, &q}, {&b.wk, &k}, {&b.wv, &v}});
    if (b.bq) be_.add(q, *b.bq, q);
    if (b.bk) be_.add(k, *b.bk, k);
    if (b.bv) be_.add(v, *b.bv, v);
    be_.rope(q, rope_, pos0);
    be_.rope(k, rope_, pos0);
    const int64_t n_kv = pos0 + n;
    reserve_rows(be_, b.k_cache, n_kv);
    reserve_rows(be_, b.v_cache, n_kv);
    be_.copy(k, b.k_cache.row_range(pos0, n));
    be_.copy(v, b.v_cache.row_range(pos0, n));

    const Tensor attn = be_.alloc(kF32, q_w, n);
    be_.attention(q, b.k_cache.row_range(0, n_kv), b.v_cache.row_range(0, n_kv), p_.n_head, p_.n_head_kv, pos0,
                  1.0f / std::sqrt(static_cast<float>(p_.head_dim)), attn);
    project(b.wo, b.bo, attn, out);
  }

  // Routing (per token): softmax over the router logits, the top-k experts
  // (ties to the lower id), their probabilities renormalized to sum 1.
  // `next`: the next MoE block's guess, enqueued right behind this router.
  void moe_ffn(const LlamaBlock& b, int il, const Tensor& cur, const Tensor& out, const NextGuess& next) {
    const int64_t n = cur.rows(), K = p_.n_expert_used;
    const Tensor probs = be_.alloc(kF32, p_.n_expert, n);
    be_.matmul(*b.router, cur, probs);
    be_.softmax_rows(probs);
    Routing r = make_routing(be_, n, K, next.router ? next.guesser->per_layer() : 0);
    be_.top_k(probs, r.ids);
    if (next.router) next.guesser->enqueue(be_, next, r);
    be_.take(probs, r.ids, r.weights);
    be_.normalize_rows(r.weights, 6.103515625e-5f);  // llama.cpp's guard against a zero sum
    const ExpertFfn ffn{[&](const ExpertWeights& ew) {
                          const std::string who = "llama: expert " + std::to_string(ew.expert) + " of block " + std::to_string(il);
                          const Tensor* down = ew.role("down");
                          if (!down) throw ModelError(who + " has no down projection");
                          return expert_matrices(ew, p_.n_embd, down->width(), p_.n_embd, who);
                        },
                        swiglu_};
    run_routed_experts(be_, *experts_, il, cur, r, ffn, /*accumulate=*/false, out, next.guesser);
  }

  Backend& be_;
  LlamaParams p_;
  RopeSpec rope_;
  ExpertSource* experts_;
  Tensor token_embd_, output_, output_norm_;
  std::vector<LlamaBlock> blocks_;
  std::unique_ptr<NextLayerGuesser> guesser_;  // --prefetch-next; nullptr when off
  int n_past_ = 0;
  const GateActivation swiglu_ = [this](const Tensor& g, const Tensor& u) { be_.swiglu(g, u, 0.0f, g); };
};

}  // namespace

std::unique_ptr<Model> make_llama(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o) {
  return std::make_unique<Llama>(w, be, experts, o);
}

}  // namespace xrun
