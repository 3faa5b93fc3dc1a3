#include "server_openai.h"

namespace xrun {

using nlohmann::ordered_json;

namespace {

ordered_json head_json(const ResponseHead& h, bool chunk) {
  ordered_json j;
  j["id"] = h.id;
  j["object"] = h.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = h.created;
  j["model"] = h.model;
  return j;
}

ordered_json finish_value(const std::string& f) { return f.empty() ? ordered_json(nullptr) : ordered_json(f); }

}  // namespace

ordered_json error_json(const ApiError& e) {
  ordered_json err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ordered_json(nullptr) : ordered_json(e.param);
  err["code"] = e.code.empty() ? ordered_json(nullptr) : ordered_json(e.code);
  return {{"error", err}};
}

ordered_json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

ordered_json completion_json(const ResponseHead& h, const std::string& text, const std::string& finish_reason,
                             const Usage& u) {
  ordered_json j = head_json(h, false);
  ordered_json choice;
  choice["index"] = 0;
  if (h.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_value(finish_reason);
  j["choices"] = ordered_json::array({choice});
  j["usage"] = usage_json(u);
  return j;
}

ordered_json chunk_json(const ResponseHead& h, const std::string& text, const std::string& finish_reason, bool first) {
  ordered_json j = head_json(h, true);
  ordered_json choice;
  choice["index"] = 0;
  if (h.chat) {
    ordered_json delta = ordered_json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_value(finish_reason);
  j["choices"] = ordered_json::array({choice});
  return j;
}

ordered_json usage_chunk_json(const ResponseHead& h, const Usage& u) {
  ordered_json j = head_json(h, true);
  j["choices"] = ordered_json::array();
  j["usage"] = usage_json(u);
  return j;
}

ordered_json models_json(const std::string& model_id, int64_t created) {
  ordered_json m;
  m["id"] = model_id;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "xpack-run";
  return {{"object", "list"}, {"data", ordered_json::array({m})}};
}

std::string dump_json(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

std::string sse_event(const ordered_json& j) { return "data: " + dump_json(j) + "\n\n"; }

size_t utf8_complete_prefix(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a sequence still open.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return len > back ? n - back : n;
  }
  return n;  // stray continuation bytes: ill-formed, dump_json replaces them
}

}  // namespace xrun
