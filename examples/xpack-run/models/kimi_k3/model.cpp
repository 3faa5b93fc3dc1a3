// Kimi-K3: the layer stack, as llama.cpp's kimi-k3 graph builds it.
//
// Each layer is attention (KDA or MLA) then an FFN (dense for the leading
// layers, latent MoE after), both pre-normed. What differs from a plain
// residual stack is cross-layer residual attention (attn_res.block_size > 0):
//
//   - every block_size-th layer banks its RAW input as a checkpoint, and its
//     residual stream restarts from the attention output alone;
//   - the input of every attention, every FFN and of the output head is not
//     the residual stream h itself but a softmax mix of the banked checkpoints
//     and h, scored per token by dot(rms_norm(.), score_weight):
//         mix(h) = sum_c p_c ckpt_c + p_h h,   p = softmax([s(ckpt_0) .. s(h)])
//     (scores use normed values, the sum uses the raw ones).
//
// Per-sequence state: each KDA layer's conv + delta-rule state, each MLA layer's
// latent KV cache. Nothing else carries across eval() calls, so a batch and the
// same tokens one at a time give the same logits.
//
// With --prefetch-next each MoE layer guesses the next MoE layer's experts
// (next_layer_guess.h) from its own FFN input.
#include <memory>

#include <nlohmann/json.hpp>

#include "../../model.h"
#include "kimi_k3.h"
#include "xpack/xpack.h"

namespace xrun {
namespace kimi_k3 {

std::string layer_name(int il, const char* what) { return "blk." + std::to_string(il) + "." + what; }

namespace {

constexpr uint32_t kF32 = XPACK_TYPE_F32;

struct Layer {
  Tensor attn_norm, ffn_norm;
  Tensor attn_res_score, ffn_res_score;  // only with residual attention
  std::unique_ptr<KdaLayer> kda;
  std::unique_ptr<MlaLayer> mla;
  std::unique_ptr<DenseFfn> dense;
  std::unique_ptr<LatentMoe> moe;
};

class KimiK3 final : public Model {
 public:
  KimiK3(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o)
      : be_(be), ops_(make_kimi_ops(be)), hp_(Hparams::load(w)) {
    const int64_t E = hp_.n_embd;
    tok_embd_ = be.weight(w.get("token_embd.weight", {E, hp_.n_vocab}));
    output_norm_ = float_weight(be, w.get("output_norm.weight", {E}));
    output_ = be.weight(w.get("output.weight", {E, hp_.n_vocab}));
    if (hp_.res_block_size > 0) output_res_score_ = float_weight(be, w.get("output_res_score.weight", {E}));

    layers_.resize(hp_.n_layer);
    for (int il = 0; il < hp_.n_layer; ++il) {
      Layer& l = layers_[il];
      l.attn_norm = float_weight(be, w.get(layer_name(il, "attn_norm.weight"), {E}));
      l.ffn_norm = float_weight(be, w.get(layer_name(il, "ffn_norm.weight"), {E}));
      if (hp_.res_block_size > 0) {
        l.attn_res_score = float_weight(be, w.get(layer_name(il, "attn_res_score.weight"), {E}));
        l.ffn_res_score = float_weight(be, w.get(layer_name(il, "ffn_res_score.weight"), {E}));
      }
      if (hp_.is_kda[il])
        l.kda = std::make_unique<KdaLayer>(w, hp_, be, *ops_, il);
      else
        l.mla = std::make_unique<MlaLayer>(w, hp_, be, *ops_, il);
      if (il < hp_.n_dense_lead)
        l.dense = std::make_unique<DenseFfn>(w, hp_, be, *ops_, il);
      else
        l.moe = std::make_unique<LatentMoe>(w, hp_, be, *ops_, il, experts);
    }
    if (hp_.n_dense_lead < hp_.n_layer) guesser_ = make_guesser(o, hp_.n_expert);
    if (guesser_) {
      routers_.resize(layers_.size());
      for (size_t il = 0; il < layers_.size(); ++il)
        if (layers_[il].moe) routers_[il] = layers_[il].moe->guess_router();
    }
    reset();
  }

  nlohmann::ordered_json counters_json() const override {
    return guesser_ ? guesser_->counters_json() : nlohmann::ordered_json::object();
  }
  KimiK3(const KimiK3&) = delete;
  KimiK3& operator=(const KimiK3&) = delete;

  int n_vocab() const override { return static_cast<int>(hp_.n_vocab); }

  void reset() override {
    n_past_ = 0;
    kda_state_.assign(hp_.n_layer, {});
    mla_cache_.assign(hp_.n_layer, {});
    for (int il = 0; il < hp_.n_layer; ++il) {
      if (layers_[il].kda) layers_[il].kda->init_state(kda_state_[il]);
      if (layers_[il].mla) layers_[il].mla->init_cache(mla_cache_[il]);
    }
  }

  void eval(const int32_t* tokens, int n, int pos0, float* logits, LogitRows rows) override {
    if (n <= 0) return;
    check_eval("kimi-k3", tokens, n, pos0, n_past_, hp_.n_vocab);
    be_.capture_until_download(n, /*step_start=*/true);
    const int64_t E = hp_.n_embd;
    const float eps = hp_.norm_eps;
    const bool use_res = hp_.res_block_size > 0;

    // token embeddings
    Tensor h = be_.empty(kF32, E, n);
    be_.get_rows(tok_embd_, be_.upload(XPACK_TYPE_I32, tokens, 1, n), h);

    std::vector<Tensor> ckpts;  // the banked checkpoints of this call, each [n][n_embd]
    // Each written whole by the operation that fills it (rms_norm, a sub-layer's output product, res_mix).
    const Tensor normed = be_.empty(kF32, E, n), sub = be_.empty(kF32, E, n), mixed = be_.empty(kF32, E, n);
    // Cross-layer residual attention: the input of a sub-layer mixes the
    // checkpoints and the current stream (the stream itself while none is banked).
    auto input_of = [&](const Tensor& score_w) -> Tensor {
      if (!use_res || ckpts.empty()) return h;
      ops_->res_mix(h, ckpts, score_w, eps, mixed);
      return mixed;
    };

    for (int il = 0; il < hp_.n_layer; ++il) {
      const Layer& l = layers_[il];

      // --- attention
      be_.rms_norm(input_of(l.attn_res_score), &l.attn_norm, eps, normed);
      const bool banked = use_res && il % hp_.res_block_size == 0;
      if (l.kda)
        l.kda->forward(normed, kda_state_[il], sub);
      else
        l.mla->forward(normed, mla_cache_[il], sub);
      if (banked) {
        ckpts.push_back(h);  // the raw layer input, not the mix
        h = be_.empty(kF32, E, n);
        be_.copy(sub, h);  // the stream restarts from the attention output
      } else {
        be_.add(h, sub, h);
      }

      // --- FFN
      const Tensor ffn_in = input_of(l.ffn_res_score);
      // The next MoE layer's guess, made by this one.
      NextGuess next{guesser_.get(), nullptr, {}};
      if (guesser_ && l.moe && il + 1 < hp_.n_layer && layers_[il + 1].moe) {
        next.router = &routers_[il + 1];
        if (guesser_->state() == GuessState::renormed) {
          next.state = be_.empty(kF32, E, n);
          be_.rms_norm(ffn_in, &layers_[il + 1].ffn_norm, eps, next.state);
        }
      }
      be_.rms_norm(ffn_in, &l.ffn_norm, eps, normed);
      if (next.router && guesser_->state() == GuessState::moe_input) next.state = normed;
      if (l.dense)
        l.dense->forward(normed, sub);
      else
        l.moe->forward(normed, sub, next);
      be_.add(h, sub, h);
    }

    // --- output head (every position, or the last)
    be_.rms_norm(input_of(output_res_score_), &output_norm_, eps, normed);
    download_logits(be_, output_, normed, logits, rows);
    n_past_ += n;
  }

 private:
  Backend& be_;
  std::unique_ptr<KimiOps> ops_;
  Hparams hp_;  // the layers keep a reference: KimiK3 is never moved (held by unique_ptr)
  Tensor tok_embd_, output_, output_norm_, output_res_score_;
  std::vector<Layer> layers_;
  std::vector<KdaState> kda_state_;
  std::vector<MlaCache> mla_cache_;
  std::unique_ptr<NextLayerGuesser> guesser_;  // --prefetch-next; nullptr when off
  std::vector<GuessRouter> routers_;           // per layer (MoE ones) for the guesses
  int n_past_ = 0;
};

}  // namespace
}  // namespace kimi_k3

std::unique_ptr<Model> make_kimi_k3(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o) {
  return std::make_unique<kimi_k3::KimiK3>(w, be, experts, o);
}

}  // namespace xrun
