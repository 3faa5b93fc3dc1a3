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
#include <cmath>
#include <memory>

#include "../../model.h"
#include "../../ops.h"
#include "kimi_k3.h"

namespace xrun {
namespace kimi_k3 {

std::string layer_name(int il, const char* what) { return "blk." + std::to_string(il) + "." + what; }

void rms_norm_row(const float* x, const float* weight, int64_t n, float eps, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = weight ? (x[i] * scale) * weight[i] : x[i] * scale;
}

void softmax_row(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

struct Layer {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> attn_res_score, ffn_res_score;  // empty without residual attention
  std::unique_ptr<KdaLayer> kda;
  std::unique_ptr<MlaLayer> mla;
  std::unique_ptr<DenseFfn> dense;
  std::unique_ptr<LatentMoe> moe;
};

// The banked checkpoints of one eval() call, each [n][n_embd].
using Checkpoints = std::vector<std::vector<float>>;

// Cross-layer residual attention: mix the checkpoints and the current stream.
std::vector<float> res_mix(const std::vector<float>& cur, const Checkpoints& ckpts,
                           const std::vector<float>& score_w, int n, int64_t E, float eps) {
  if (ckpts.empty()) return cur;  // nothing banked yet (layer 0's attention)
  const size_t nc = ckpts.size();
  std::vector<float> out(cur.size());
  std::vector<float> normed(static_cast<size_t>(E)), p(nc + 1);
  auto score = [&](const float* row) {
    rms_norm_row(row, nullptr, E, eps, normed.data());
    double s = 0.0;
    for (int64_t i = 0; i < E; ++i) s += static_cast<double>(normed[i] * score_w[i]);
    return static_cast<float>(s);
  };
  for (int t = 0; t < n; ++t) {
    for (size_t c = 0; c < nc; ++c) p[c] = score(&ckpts[c][t * E]);
    p[nc] = score(&cur[t * E]);
    softmax_row(p.data(), static_cast<int64_t>(nc + 1));
    for (int64_t i = 0; i < E; ++i) {
      float acc = 0.0f;
      for (size_t c = 0; c < nc; ++c) acc += ckpts[c][t * E + i] * p[c];
      out[t * E + i] = acc + cur[t * E + i] * p[nc];
    }
  }
  return out;
}

class KimiK3 final : public Model {
 public:
  KimiK3(const Weights& w, ExpertSource* experts) : hp_(Hparams::load(w)) {
    const int64_t E = hp_.n_embd;
    tok_embd_ = &w.get("token_embd.weight", {E, hp_.n_vocab});
    output_norm_ = to_float(w.get("output_norm.weight", {E}));
    output_ = &w.get("output.weight", {E, hp_.n_vocab});
    if (hp_.res_block_size > 0) output_res_score_ = to_float(w.get("output_res_score.weight", {E}));

    layers_.resize(hp_.n_layer);
    for (int il = 0; il < hp_.n_layer; ++il) {
      Layer& l = layers_[il];
      l.attn_norm = to_float(w.get(layer_name(il, "attn_norm.weight"), {E}));
      l.ffn_norm = to_float(w.get(layer_name(il, "ffn_norm.weight"), {E}));
      if (hp_.res_block_size > 0) {
        l.attn_res_score = to_float(w.get(layer_name(il, "attn_res_score.weight"), {E}));
        l.ffn_res_score = to_float(w.get(layer_name(il, "ffn_res_score.weight"), {E}));
      }
      if (hp_.is_kda[il])
        l.kda = std::make_unique<KdaLayer>(w, hp_, il);
      else
        l.mla = std::make_unique<MlaLayer>(w, hp_, il);
      if (il < hp_.n_dense_lead)
        l.dense = std::make_unique<DenseFfn>(w, hp_, il);
      else
        l.moe = std::make_unique<LatentMoe>(w, hp_, il, experts);
    }
    reset();
  }
  KimiK3(const KimiK3&) = delete;
  KimiK3& operator=(const KimiK3&) = delete;

  int n_vocab() const override { return static_cast<int>(hp_.n_vocab); }

  void reset() override {
    n_past_ = 0;
    kda_state_.assign(hp_.n_layer, {});
    mla_cache_.assign(hp_.n_layer, {});
    for (int il = 0; il < hp_.n_layer; ++il)
      if (layers_[il].kda) layers_[il].kda->init_state(kda_state_[il]);
  }

  void eval(const int32_t* tokens, int n, int pos0, float* logits) override {
    if (n <= 0) return;
    if (pos0 != n_past_)
      throw ModelError("kimi-k3: eval at position " + std::to_string(pos0) + " but " +
                       std::to_string(n_past_) + " tokens are in the sequence");
    const int64_t E = hp_.n_embd;
    const float eps = hp_.norm_eps;
    const bool use_res = hp_.res_block_size > 0;

    // token embeddings
    std::vector<float> h(static_cast<size_t>(n * E));
    const size_t embd_row = row_bytes(tok_embd_->type, E);
    for (int t = 0; t < n; ++t) {
      if (tokens[t] < 0 || tokens[t] >= hp_.n_vocab)
        throw ModelError("kimi-k3: token id " + std::to_string(tokens[t]) + " outside the vocabulary");
      dequantize(tok_embd_->type, static_cast<const char*>(tok_embd_->data) + tokens[t] * embd_row, &h[t * E], E);
    }

    Checkpoints ckpts;
    std::vector<float> normed(h.size()), sub(h.size());
    auto norm_rows = [&](const std::vector<float>& in, const std::vector<float>& wgt) {
      for (int t = 0; t < n; ++t) rms_norm_row(&in[t * E], wgt.data(), E, eps, &normed[t * E]);
    };

    for (int il = 0; il < hp_.n_layer; ++il) {
      const Layer& l = layers_[il];

      // --- attention
      const std::vector<float> attn_in = use_res ? res_mix(h, ckpts, l.attn_res_score, n, E, eps) : h;
      const bool banked = use_res && il % hp_.res_block_size == 0;
      if (banked) ckpts.push_back(h);  // the raw layer input, not the mix
      norm_rows(attn_in, l.attn_norm);
      if (l.kda)
        l.kda->forward(normed.data(), n, kda_state_[il], sub.data());
      else
        l.mla->forward(normed.data(), n, mla_cache_[il], sub.data());
      if (banked)
        h = sub;  // the stream restarts from the attention output
      else
        for (size_t i = 0; i < h.size(); ++i) h[i] += sub[i];

      // --- FFN
      const std::vector<float> ffn_in = use_res ? res_mix(h, ckpts, l.ffn_res_score, n, E, eps) : h;
      norm_rows(ffn_in, l.ffn_norm);
      if (l.dense)
        l.dense->forward(normed.data(), n, sub.data());
      else
        l.moe->forward(normed.data(), n, sub.data());
      for (size_t i = 0; i < h.size(); ++i) h[i] += sub[i];
    }

    // --- output head (every position)
    const std::vector<float> out_in = use_res ? res_mix(h, ckpts, output_res_score_, n, E, eps) : h;
    norm_rows(out_in, output_norm_);
    matmul(*output_, normed.data(), n, logits);
    n_past_ += n;
  }

 private:
  Hparams hp_;  // the layers keep a reference: KimiK3 is never moved (held by unique_ptr)
  const WeightTensor *tok_embd_ = nullptr, *output_ = nullptr;
  std::vector<float> output_norm_, output_res_score_;
  std::vector<Layer> layers_;
  std::vector<KdaState> kda_state_;
  std::vector<MlaCache> mla_cache_;
  int n_past_ = 0;
};

}  // namespace
}  // namespace kimi_k3

std::unique_ptr<Model> make_kimi_k3(const Weights& w, Backend& /*be: not yet used*/, ExpertSource* experts) {
  return std::make_unique<kimi_k3::KimiK3>(w, experts);
}

}  // namespace xrun
