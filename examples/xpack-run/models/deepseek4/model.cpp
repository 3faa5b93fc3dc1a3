// DeepSeek-V4-Flash (GGUF arch `deepseek4`), CPU reference graph.
//
//   stream = hc_mult copies of token_embd[token]
//   for every main block:
//     x = hc_attn.pre(stream);  stream = hc_attn.post(attention(attn_norm(x)), stream)
//     x = hc_ffn.pre(stream);   stream = hc_ffn.post(moe(ffn_norm(x)), stream)
//   logits = output . output_norm(hc_head(stream))
//
// Each mechanism lives in its own file of this folder: hparams (metadata),
// hyper_connections (mHC + Sinkhorn), attention (MQA with sliding window,
// compressed blocks, indexer, sinks, grouped output LoRA), compressor (CSA /
// HCA KV compression), rope (RoPE / YaRN) and moe (hash and learned routing,
// clamped SwiGLU experts, shared expert). MTP (nextn) blocks are not run.
#include <memory>
#include <vector>

#include "../../model.h"
#include <functional>  // ops.h uses std::function before including it

#include "../../ops.h"
#include "attention.h"
#include "hparams.h"
#include "hyper_connections.h"
#include "moe.h"

namespace xrun {

namespace {

using namespace ds4;

struct Block {
  std::vector<float> attn_norm, ffn_norm;
  HcSite hc_attn, hc_ffn;
  Attention attention;
  MoeBlock moe;

  Block(const Weights& w, const Hparams& hp, int64_t il, ExpertSource* experts)
      : attn_norm(to_float(w.get(blk(il, "attn_norm.weight"), {hp.n_embd}))),
        ffn_norm(to_float(w.get(blk(il, "ffn_norm.weight"), {hp.n_embd}))),
        hc_attn(w, hp, blk(il, "hc_attn")),
        hc_ffn(w, hp, blk(il, "hc_ffn")),
        attention(w, hp, il),
        moe(w, hp, il, experts) {}
};

class Deepseek4 final : public Model {
 public:
  Deepseek4(const Weights& w, ExpertSource* experts)
      : hp_(load_hparams(w)),
        token_embd_(&w.get("token_embd.weight", {hp_.n_embd, hp_.n_vocab})),
        output_norm_(to_float(w.get("output_norm.weight", {hp_.n_embd}))),
        output_(&w.get("output.weight", {hp_.n_embd, hp_.n_vocab})),
        head_(w, hp_) {
    blocks_.reserve(static_cast<size_t>(hp_.n_layer));
    for (int64_t il = 0; il < hp_.n_layer; ++il) blocks_.push_back(std::make_unique<Block>(w, hp_, il, experts));
  }

  int n_vocab() const override { return static_cast<int>(hp_.n_vocab); }

  void reset() override {
    for (auto& b : blocks_) b->attention.reset();
    n_past_ = 0;
  }

  void eval(const int32_t* tokens, int n, int pos0, float* logits) override {
    if (n <= 0) return;
    if (pos0 != n_past_) {
      throw ModelError("deepseek4: eval at position " + std::to_string(pos0) + " but " + std::to_string(n_past_) +
                       " tokens were evaluated (the sequence must continue)");
    }
    for (int t = 0; t < n; ++t) {
      if (tokens[t] < 0 || tokens[t] >= hp_.n_vocab) {
        throw ModelError("deepseek4: token id " + std::to_string(tokens[t]) + " outside the vocabulary");
      }
    }
    const int64_t d = hp_.n_embd, hc = hp_.hc_mult, width = hc * d;

    // The residual stream starts as hc_mult identical copies of the embedding.
    std::vector<float> stream(static_cast<size_t>(n * width));
    const size_t rb = row_bytes(token_embd_->type, d);
    for (int t = 0; t < n; ++t) {
      float* row = stream.data() + t * width;
      dequantize(token_embd_->type, static_cast<const uint8_t*>(token_embd_->data) + tokens[t] * rb, row, d);
      for (int64_t h = 1; h < hc; ++h) std::copy_n(row, d, row + h * d);
    }

    std::vector<float> residual(stream.size()), x(static_cast<size_t>(n * d)), y(static_cast<size_t>(n * d));
    HcMixing mix;
    for (auto& blk_ptr : blocks_) {
      Block& b = *blk_ptr;
      residual = stream;
      b.hc_attn.pre(stream.data(), n, x.data(), mix);
      for (int t = 0; t < n; ++t) rms_norm(x.data() + t * d, b.attn_norm.data(), d, hp_.rms_eps, x.data() + t * d);
      b.attention.forward(x.data(), n, pos0, y.data());
      b.hc_attn.post(y.data(), residual.data(), n, mix, stream.data());

      residual = stream;
      b.hc_ffn.pre(stream.data(), n, x.data(), mix);
      for (int t = 0; t < n; ++t) rms_norm(x.data() + t * d, b.ffn_norm.data(), d, hp_.rms_eps, x.data() + t * d);
      b.moe.forward(x.data(), tokens, n, y.data());
      b.hc_ffn.post(y.data(), residual.data(), n, mix, stream.data());
    }

    head_.collapse(stream.data(), n, x.data());
    for (int t = 0; t < n; ++t) rms_norm(x.data() + t * d, output_norm_.data(), d, hp_.rms_eps, x.data() + t * d);
    matmul(*output_, x.data(), n, logits);
    n_past_ += n;
  }

 private:
  Hparams hp_;
  const WeightTensor* token_embd_;
  std::vector<float> output_norm_;
  const WeightTensor* output_;
  HcHead head_;
  std::vector<std::unique_ptr<Block>> blocks_;
  int64_t n_past_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_deepseek4(const Weights& w, Backend& /*be: not yet used*/, ExpertSource* experts) {
  return std::make_unique<Deepseek4>(w, experts);
}

}  // namespace xrun
