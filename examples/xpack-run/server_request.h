// The body of POST /v1/completions and /v1/chat/completions, read and checked
// against the OpenAI API's types before anything touches the model. No I/O and
// no HTTP: the server hands it the body, the tests hand it hostile ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "chat_template.h"
#include "sampling.h"

namespace xrun {

// An answer that is not a completion, as OpenAI writes it:
// {"error": {"message", "type", "param", "code"}} with the HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field; empty = none
  std::string code;   // empty = null
};

struct GenerateRequest {
  bool chat = false;
  std::string model;                               // echoed back; any name is accepted
  std::optional<std::string> prompt;               // completions: text
  std::optional<std::vector<int32_t>> prompt_ids;  // completions: token ids, used as-is
  std::vector<ChatMessage> messages;               // chat
  std::optional<int64_t> max_tokens;               // absent = the server's default (-n)
  SamplingParams sampling;                         // the server's defaults, overridden per field
  std::optional<uint64_t> seed;                    // absent = a random one
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool ignore_eos = false;     // llama-server's extension: keep generating after end-of-sequence
};

// Most stop strings a request may give: each is scanned for at every token.
constexpr size_t kMaxStopStrings = 16;

// Parses `body` for the chat (true) or the completions endpoint. `defaults` are
// the sampling values of the command line, which fields of the request override.
std::variant<GenerateRequest, ApiError> parse_generate_request(std::string_view body, bool chat,
                                                               const SamplingParams& defaults);

}  // namespace xrun
