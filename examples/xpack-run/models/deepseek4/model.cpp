// DeepSeek-V4-Flash (GGUF arch `deepseek4`), written once against the backend.
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
// clamped SwiGLU experts, shared expert); ds4_ops holds the operations only
// this model uses, with their CPU versions (*_cpu.cpp). MTP (nextn) blocks are not run.
//
// Prefetch: the hash-routed layers' experts are exact at a step's start; with
// --prefetch-next each MoE layer also guesses the next learned-router layer's
// experts (next_layer_guess.h) from its own FFN input.
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../backend.h"
#include "../../model.h"
#include "attention.h"
#include "ds4_ops.h"
#include "hparams.h"
#include "hyper_connections.h"
#include "moe.h"
#include "xpack/xpack.h"

namespace xrun {

namespace {

using namespace ds4;

constexpr uint32_t kF32 = XPACK_TYPE_F32;

struct Block {
  Tensor attn_norm, ffn_norm;
  HcSite hc_attn, hc_ffn;
  Attention attention;
  MoeBlock moe;

  Block(const Weights& w, const Hparams& hp, Backend& be, Ds4Ops& ops, int64_t il, ExpertSource* experts)
      : attn_norm(float_weight(be, w.get(blk(il, "attn_norm.weight"), {hp.n_embd}))),
        ffn_norm(float_weight(be, w.get(blk(il, "ffn_norm.weight"), {hp.n_embd}))),
        hc_attn(w, hp, be, ops, blk(il, "hc_attn")),
        hc_ffn(w, hp, be, ops, blk(il, "hc_ffn")),
        attention(w, hp, be, ops, il),
        moe(w, hp, be, il, experts) {}
};

class Deepseek4 final : public Model {
 public:
  Deepseek4(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o)
      : be_(be),
        hash_prefetch_(o.hash_prefetch),
        ops_(make_ds4_ops(be)),
        hp_(load_hparams(w)),
        token_embd_(be.weight(w.get("token_embd.weight", {hp_.n_embd, hp_.n_vocab}))),
        output_norm_(float_weight(be, w.get("output_norm.weight", {hp_.n_embd}))),
        output_(be.weight(w.get("output.weight", {hp_.n_embd, hp_.n_vocab}))),
        head_(w, hp_, be, *ops_) {
    blocks_.reserve(static_cast<size_t>(hp_.n_layer));
    for (int64_t il = 0; il < hp_.n_layer; ++il) blocks_.push_back(std::make_unique<Block>(w, hp_, be, *ops_, il, experts));
    guesser_ = make_guesser(o, hp_.n_expert);
    if (guesser_) {
      routers_.resize(blocks_.size());
      for (size_t il = 0; il < blocks_.size(); ++il)
        if (!blocks_[il]->moe.hash_routed()) routers_[il] = blocks_[il]->moe.guess_router();
    }
  }

  nlohmann::ordered_json counters_json() const override {
    return guesser_ ? guesser_->counters_json() : nlohmann::ordered_json::object();
  }

  int n_vocab() const override { return static_cast<int>(hp_.n_vocab); }

  void reset() override {
    for (auto& b : blocks_) b->attention.reset();
    n_past_ = 0;
  }

  void eval(const int32_t* tokens, int n, int pos0, float* logits, LogitRows rows) override {
    if (n <= 0) return;
    check_eval("deepseek4", tokens, n, pos0, n_past_, hp_.n_vocab);
    // The hash-routed layers' experts follow from the token ids alone: their
    // reads start now, behind the embedding and the attention before them.
    if (hash_prefetch_)
      for (auto& b : blocks_) b->moe.prefetch_hash_experts(tokens, n);
    const int64_t d = hp_.n_embd, hc = hp_.hc_mult, width = hc * d;
    be_.capture_until_download(n, /*step_start=*/true);
    // The residual stream starts as hc_mult identical copies of the embedding:
    // copy h of token t is row t * hc + h of the stream seen as [n * hc][d].
    // One upload: the ids (the hash layers' routing reads them), then the repeated ids.
    std::vector<int32_t> lists(tokens, tokens + n);
    for (int64_t i = 0; i < n * hc; ++i) lists.push_back(tokens[i / hc]);
    const Tensor uploaded = be_.upload(XPACK_TYPE_I32, lists.data(), 1, n + n * hc);
    const Tensor ids = uploaded.row_range(0, n);
    const Tensor stream = be_.empty(kF32, width, n);
    be_.get_rows(token_embd_, uploaded.row_range(n, n * hc), stream.reshaped(d, n * hc));

    const Tensor x = be_.empty(kF32, d, n), y = be_.empty(kF32, d, n);  // hc pre and each block write them whole
    HcMixing mix;
    for (size_t il = 0; il < blocks_.size(); ++il) {
      Block& b = *blocks_[il];
      b.hc_attn.pre(stream, x, mix, &b.attn_norm);
      b.attention.forward(x, pos0, y);
      b.hc_attn.post(y, stream, mix, stream);  // pre left the stream as it was: it is the residual

      // The next layer's guess, if it routes by a learned router; a guess from
      // the state before this layer's norm needs that state, so the norm stays
      // a step of its own only then.
      NextGuess next{guesser_.get(), nullptr, {}};
      if (guesser_ && il + 1 < blocks_.size() && !blocks_[il + 1]->moe.hash_routed()) next.router = &routers_[il + 1];
      const bool renormed_guess = next.router && guesser_->state() == GuessState::renormed;
      b.hc_ffn.pre(stream, x, mix, renormed_guess ? nullptr : &b.ffn_norm);
      if (renormed_guess) {
        next.state = be_.alloc(kF32, d, n);
        be_.rms_norm(x, &blocks_[il + 1]->ffn_norm, hp_.rms_eps, next.state);
        be_.rms_norm(x, &b.ffn_norm, hp_.rms_eps, x);
      }
      if (next.router && guesser_->state() == GuessState::moe_input) next.state = x;
      b.moe.forward(x, ids, tokens, y, next);
      b.hc_ffn.post(y, stream, mix, stream);
    }

    head_.collapse(stream, x, &output_norm_);
    download_logits(be_, output_, x, logits, rows);
    n_past_ += n;
  }

 private:
  Backend& be_;
  bool hash_prefetch_;
  std::unique_ptr<Ds4Ops> ops_;
  Hparams hp_;
  Tensor token_embd_;
  Tensor output_norm_;
  Tensor output_;
  HcHead head_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<NextLayerGuesser> guesser_;  // --prefetch-next; nullptr when off
  std::vector<GuessRouter> routers_;           // per block (learned-router ones) for the guesses
  int64_t n_past_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_deepseek4(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o) {
  return std::make_unique<Deepseek4>(w, be, experts, o);
}

}  // namespace xrun
