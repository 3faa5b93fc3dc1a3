#include "server_engine.h"

#include <algorithm>
#include <stdexcept>

#include "chat_cli.h"

namespace xrun {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prefill in pieces of this many tokens: the logits of a whole long prompt at
// once (n x n_vocab floats) would take gigabytes on a large vocabulary.
constexpr int kPrefillChunk = 512;

ApiError too_long(const std::string& what, const std::string& why) {
  return ApiError{400, "the " + what + " is longer than the context: " + why, "invalid_request_error",
                  what == "prompt" ? "prompt" : "messages", "context_length_exceeded"};
}

}  // namespace

std::variant<PreparedRequest, ApiError> Engine::prepare(const GenerateRequest& r) const {
  const std::string param = r.chat ? "messages" : "prompt";
  const std::string what = r.chat ? "conversation (messages)" : "prompt";
  const std::string ctx = std::to_string(s_.n_ctx);
  std::string text;
  PreparedRequest p;
  if (r.chat) {
    ChatOptions copt;
    copt.thinking = false;  // the reply is returned as content; a think channel is not parsed back
    copt.bos_token = s_.bos_text;
    try {
      text = render_chat(s_.format, r.messages, copt);
    } catch (const std::invalid_argument& e) {
      return ApiError{400, std::string("messages: ") + e.what(), "invalid_request_error", "messages", ""};
    }
    for (const std::string& s : chat_turn_stops(s_.format)) p.stops.push_back(s);
  } else if (r.prompt) {
    text = *r.prompt;
  }
  if (r.prompt_ids) {
    p.prompt = *r.prompt_ids;
    const int n_vocab = s_.model.n_vocab();
    for (int32_t id : p.prompt)
      if (id >= n_vocab)
        return ApiError{400, "token id " + std::to_string(id) + " is not in the vocabulary of " +
                                 std::to_string(n_vocab), "invalid_request_error", "prompt", ""};
  } else {
    // Each token covers at most max_piece_bytes of text: a text longer than
    // n_ctx of them cannot fit, and is refused before the tokenizer spends time on it.
    if (s_.n_ctx > 0 && text.size() / s_.max_piece_bytes > static_cast<uint64_t>(s_.n_ctx))
      return too_long(what, std::to_string(text.size()) + " bytes, and no token covers more than " +
                                std::to_string(s_.max_piece_bytes) + ", so more than the " + ctx + " tokens it holds");
    p.prompt = s_.codec.encode(text);
  }
  if (p.prompt.empty()) return ApiError{400, "the " + param + " is empty", "invalid_request_error", param, ""};
  const int64_t n_prompt = static_cast<int64_t>(p.prompt.size());
  if (s_.n_ctx > 0 && n_prompt >= s_.n_ctx)
    return too_long(what, std::to_string(n_prompt) + " tokens, and the context of " + ctx +
                              " tokens must also hold the generated ones");
  const int64_t room = s_.n_ctx > 0 ? s_.n_ctx - n_prompt : INT32_MAX;
  if (r.max_tokens) {
    if (*r.max_tokens > room)
      return ApiError{400,
                      "the " + what + " has " + std::to_string(n_prompt) + " tokens and max_tokens is " +
                          std::to_string(*r.max_tokens) + ": together more than the context of " + ctx + " tokens",
                      "invalid_request_error", "max_tokens", "context_length_exceeded"};
    p.max_tokens = static_cast<int>(*r.max_tokens);
  } else {
    p.max_tokens = static_cast<int>(std::min<int64_t>(s_.default_max_tokens, room));
  }
  p.sampling = r.sampling;
  p.sampling.seed = r.seed ? *r.seed : random_seed();
  p.stops.insert(p.stops.end(), r.stop.begin(), r.stop.end());
  p.ignore_eos = r.ignore_eos;
  return p;
}

void Engine::eval(const int32_t* tokens, int n, float* last_row) {
  const int n_vocab = s_.model.n_vocab();
  std::vector<float> logits;
  try {
    for (int i = 0; i < n; i += kPrefillChunk) {
      const int m = std::min(kPrefillChunk, n - i);
      logits.resize(n_vocab);
      s_.model.eval(tokens + i, m, static_cast<int>(evaluated_.size()), logits.data(), LogitRows::last);
      evaluated_.insert(evaluated_.end(), tokens + i, tokens + i + m);
    }
  } catch (...) {
    // The model's state is unknown after a failed eval: the next request starts afresh.
    evaluated_.clear();
    s_.model.reset();
    throw;
  }
  std::copy(logits.end() - n_vocab, logits.end(), last_row);
}

std::unique_ptr<Generation> Engine::start(PreparedRequest r) {
  std::unique_ptr<Generation> g(new Generation(*this, std::move(r)));
  const std::vector<int32_t>& prompt = g->req_.prompt;
  const size_t keep = reusable_prefix(evaluated_, prompt);
  if (keep == 0 && !evaluated_.empty()) {
    s_.model.reset();
    evaluated_.clear();
  }
  evaluated_.resize(keep);
  for (int32_t t : prompt) g->sampler_.accept(t);
  const auto t0 = std::chrono::steady_clock::now();
  eval(prompt.data() + keep, static_cast<int>(prompt.size() - keep), g->row_.data());
  g->stats_.prefill_s = seconds_since(t0);
  g->stats_.prompt_tokens = prompt.size();
  g->stats_.reused_tokens = keep;
  return g;
}

nlohmann::ordered_json Engine::engine_counters() const {
  return s_.experts ? s_.experts->counters_json() : nlohmann::ordered_json::object();
}

Generation::Generation(Engine& e, PreparedRequest r)
    : engine_(e),
      req_(std::move(r)),
      sampler_(req_.sampling),
      stops_(req_.stops),
      row_(static_cast<size_t>(e.s_.model.n_vocab())) {}

void Generation::finish(const char* why, std::string* out) {
  finish_ = why;
  *out += stops_.flush();
}

bool Generation::step(std::string* out) {
  if (!finish_.empty()) return false;
  const auto t0 = std::chrono::steady_clock::now();
  if (pending_eval_) {
    // The token sampled last is evaluated only now, once the caller asked for
    // one more: the last token of a generation is never evaluated for nothing.
    engine_.eval(&last_, 1, row_.data());
    pending_eval_ = false;
  }
  const int32_t tok = sampler_.sample(row_.data(), static_cast<int>(row_.size()));
  sampler_.accept(tok);
  ++stats_.completion_tokens;
  bool more = true;
  if (tok == engine_.s_.eos && !req_.ignore_eos) {
    finish("stop", out);
    more = false;
  } else {
    *out += stops_.feed(engine_.s_.codec.piece(tok));
    if (stops_.stopped()) {
      finish_ = "stop";
      more = false;
    } else if (static_cast<int>(stats_.completion_tokens) >= req_.max_tokens) {
      finish("length", out);
      more = false;
    } else {
      last_ = tok;
      pending_eval_ = true;
    }
  }
  stats_.decode_s += seconds_since(t0);
  return more;
}

}  // namespace xrun
