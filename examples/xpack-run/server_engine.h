// The model behind the server: a checked request becomes prompt tokens and
// limits (prepare, any thread), then runs as a Generation that yields text
// token by token (one at a time: the caller holds the RequestGate's turn).
// The evaluated tokens are kept between requests: a request whose prompt
// starts with them (a chat resending its history) evaluates only the rest.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "experts.h"
#include "model.h"
#include "sampling.h"
#include "server_request.h"
#include "stop_strings.h"
#include "text.h"

namespace xrun {

struct EngineSetup {
  Model& model;
  TextCodec& codec;  // its tokenizer is immutable: encode/piece may run on any thread
  ExpertSource* experts = nullptr;
  int64_t n_ctx = 0;           // > 0: the context every request must fit
  int32_t eos = -1;            // -1 = none
  ChatFormat format = ChatFormat::kPlain;
  std::string bos_text;        // what the chat template writes for BOS
  size_t max_piece_bytes = 1;  // the longest token's text: bounds how many bytes n_ctx tokens hold
  int default_max_tokens = 32; // -n
};

// A request checked against the model: what a Generation runs.
struct PreparedRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  SamplingParams sampling;  // seed set
  std::vector<std::string> stops;
  bool ignore_eos = false;
};

struct GenerationStats {
  size_t prompt_tokens = 0;
  size_t reused_tokens = 0;   // of prompt_tokens, kept from the previous request
  size_t completion_tokens = 0;
  double prefill_s = 0;
  double decode_s = 0;
};

class Engine;

class Generation {
 public:
  // Samples the next token; appends the text now known to be final to *out.
  // False once generation has ended (finish_reason() says why).
  bool step(std::string* out);
  // "stop" (end of sequence or a stop string) or "length"; empty while running.
  const std::string& finish_reason() const { return finish_; }
  const GenerationStats& stats() const { return stats_; }
  uint64_t seed() const { return req_.sampling.seed; }

 private:
  friend class Engine;
  Generation(Engine& e, PreparedRequest r);
  void finish(const char* why, std::string* out);

  Engine& engine_;
  PreparedRequest req_;
  Sampler sampler_;
  StopScanner stops_;
  std::vector<float> row_;
  std::string finish_;
  GenerationStats stats_;
  bool pending_eval_ = false;  // the last sampled token is not evaluated yet
  int32_t last_ = -1;
};

class Engine {
 public:
  explicit Engine(EngineSetup s) : s_(std::move(s)) {}
  // Tokens and limits for `r`, or why it cannot run (400: a prompt longer
  // than the context, a max_tokens it cannot hold, a role the format lacks).
  // Thread-safe: reads only immutable state.
  std::variant<PreparedRequest, ApiError> prepare(const GenerateRequest& r) const;
  // Evaluates the prompt (what the kept state does not already hold). Throws
  // ModelError. Not thread-safe: one Generation at a time, and the Engine
  // must outlive it.
  std::unique_ptr<Generation> start(PreparedRequest r);
  // The expert source's counters; call between generations only (the
  // sources count in plain integers).
  nlohmann::ordered_json engine_counters() const;
  int64_t n_ctx() const { return s_.n_ctx; }

 private:
  friend class Generation;
  // Runs the model on tokens past what it holds; forgets all state if it throws.
  void eval(const int32_t* tokens, int n, float* last_row);

  EngineSetup s_;
  std::vector<int32_t> evaluated_;  // the model's state, in order
};

}  // namespace xrun
