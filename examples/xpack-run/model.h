// The interface every model architecture implements. A model is built from the
// trunk weights plus an expert source and evaluates tokens at given positions,
// keeping whatever per-sequence state it needs (KV cache, recurrent state,
// compressed KV) between calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend.h"
#include "experts.h"
#include "next_layer_guess.h"
#include "weights.h"

namespace xrun {

// The logits an eval() writes: every position's (teacher forcing, --logits-out)
// or the last position's only, which is all that sampling the next token needs:
// the output projection of a long prompt's other rows (129280 x 4096 per row on
// deepseek4) and their download cost more than a layer of the prefill.
enum class LogitRows { all, last };

class Model {
 public:
  virtual ~Model() = default;
  virtual int n_vocab() const = 0;
  // Evaluates `n` tokens at positions pos0 .. pos0+n-1 (continuing the sequence
  // evaluated so far: pos0 == number of tokens already evaluated) as one batch
  // (prefill) or one token (decode). Writes n rows (LogitRows::all) or one row
  // (LogitRows::last) of n_vocab logits to `logits`.
  virtual void eval(const int32_t* tokens, int n, int pos0, float* logits, LogitRows rows) = 0;
  // Forgets the sequence (KV cache etc.).
  virtual void reset() = 0;
  // The model's own counters for --json (the next-layer guesses); empty by default.
  virtual nlohmann::ordered_json counters_json() const;
};

// What the runtime asks of every model beyond its weights.
struct ModelOptions {
  // --prefetch-next: experts of the next MoE layer guessed per layer and step
  // and handed to the expert source as a prefetch (next_layer_guess.h); 0 = off.
  int prefetch_next = 0;
  GuessState guess_state = GuessState::moe_input;
  // deepseek4: hand the hash-routed layers' exact experts to the source when a
  // step's tokens are known (--no-hash-prefetch clears it).
  bool hash_prefetch = true;
};

// The guesser a model makes for `o` (nullptr when --prefetch-next is 0), after
// checking it against the model's expert count.
std::unique_ptr<NextLayerGuesser> make_guesser(const ModelOptions& o, int64_t n_expert);

// Factories, one per architecture file in models/. They read hyperparameters
// only from GGUF metadata and throw ModelError naming a missing key/tensor.
// The model computes on `be`, which must outlive it.
std::unique_ptr<Model> make_llama(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o);
std::unique_ptr<Model> make_deepseek4(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o);
std::unique_ptr<Model> make_kimi_k3(const Weights& w, Backend& be, ExpertSource* experts, const ModelOptions& o);

// Checks an eval() call of architecture `arch`: pos0 continues the n_past
// tokens evaluated so far, every token id is in [0, n_vocab). Throws ModelError.
void check_eval(const char* arch, const int32_t* tokens, int n, int pos0, int64_t n_past, int64_t n_vocab);

// logits [n][n_vocab] on the host = output . x (x: the final normed hidden
// states [n][n_embd] on the backend), or only x's last row's with
// LogitRows::last: the one download of an eval. The last row is computed alone
// in both cases, so it is the same either way.
void download_logits(Backend& be, const Tensor& output, const Tensor& x, float* logits, LogitRows rows);

// Dispatches on w.arch(); throws ModelError("unsupported architecture X").
std::unique_ptr<Model> make_model(const Weights& w, Backend& be, ExpertSource* experts,
                                  const ModelOptions& o = ModelOptions{});

}  // namespace xrun
