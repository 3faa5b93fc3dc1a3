#include "server_request.h"

#include <cmath>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "stop_strings.h"

namespace xrun {

namespace {

using nlohmann::json;

// A refusal of field `param`; thrown inside the parser only, caught below.
struct Refusal {
  ApiError error;
};

[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw Refusal{ApiError{400, message, "invalid_request_error", param, ""}};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a non-integer number";
    default: return "an integer";
  }
}

// A field that is absent or null reads as not given, as OpenAI's API does.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) refuse(name, std::string("'") + name + "' must be a number, got " + type_name(*v));
  const double d = v->get<double>();
  // Every number field is a float: converting one beyond its range would be undefined.
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
    refuse(name, std::string("'") + name + "' is out of range");
  return d;
}

std::optional<int64_t> integer(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    refuse(name, std::string("'") + name + "' must be an integer, got " + type_name(*v));
  // An unsigned value above INT64_MAX is out of every range here.
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    refuse(name, std::string("'") + name + "' is out of range");
  const int64_t i = v->get<int64_t>();
  if (i < lo || i > hi)
    refuse(name, std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got " + std::to_string(i));
  return i;
}

std::optional<bool> boolean(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) refuse(name, std::string("'") + name + "' must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> text(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) refuse(name, std::string("'") + name + "' must be a string, got " + type_name(*v));
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const json& a, const char* name) {
  if (a.empty()) refuse(name, std::string("'") + name + "' is an empty list of token ids");
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX) ||
        t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
      refuse(name, std::string("'") + name + "' token ids must be integers in [0, 2147483647]");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// OpenAI's prompt: a string, one string in a list, token ids, or one list of them.
void read_prompt(const json& body, GenerateRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) refuse("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return;
  }
  if (!p->is_array())
    refuse("prompt", std::string("'prompt' must be a string or a list of token ids, got ") + type_name(*p));
  if (p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
    return;
  }
  if (p->size() == 1 && (*p)[0].is_array()) {
    r.prompt_ids = token_ids((*p)[0], "prompt");
    return;
  }
  if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
    refuse("prompt", "one prompt per request: 'prompt' holds " + std::to_string(p->size()));
  r.prompt_ids = token_ids(*p, "prompt");
}

// content: a string, or a list of {"type": "text", "text": ...} parts joined.
std::string message_content(const json& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  const json* c = field(m, "content");
  if (!c) return {};
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) refuse(where, "'" + where + "' must be a string or a list of parts, got " + type_name(*c));
  std::string out;
  for (const json& part : *c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      refuse(where, "'" + where + "': only {\"type\": \"text\", \"text\": ...} parts are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

void read_messages(const json& body, GenerateRequest& r) {
  const json* ms = field(body, "messages");
  if (!ms) refuse("messages", "'messages' is required");
  if (!ms->is_array()) refuse("messages", std::string("'messages' must be a list, got ") + type_name(*ms));
  if (ms->empty()) refuse("messages", "'messages' is empty");
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) refuse(where, "'" + where + "' must be an object, got " + type_name(m));
    const json* role = field(m, "role");
    if (!role || !role->is_string() || role->get<std::string>().empty())
      refuse(where + ".role", "'" + where + ".role' must be a non-empty string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    msg.content = message_content(m, i);
    if (const json* rc = field(m, "reasoning_content")) {
      if (!rc->is_string()) refuse(where + ".reasoning_content", "'" + where + ".reasoning_content' must be a string");
      msg.reasoning = rc->get<std::string>();
    }
    r.messages.push_back(std::move(msg));
  }
}

void read_stop(const json& body, GenerateRequest& r) {
  const json* s = field(body, "stop");
  if (!s) return;
  if (s->is_string()) {
    r.stop.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (s->size() > kMaxStopStrings)
      refuse("stop", "'stop' holds " + std::to_string(s->size()) + " strings, at most " +
                         std::to_string(kMaxStopStrings) + " are accepted");
    for (const json& x : *s) {
      if (!x.is_string()) refuse("stop", std::string("'stop' must hold strings, got ") + type_name(x));
      r.stop.push_back(x.get<std::string>());
    }
  } else {
    refuse("stop", std::string("'stop' must be a string or a list of strings, got ") + type_name(*s));
  }
  if (!check_stop_strings(r.stop).empty()) refuse("stop", "'stop' holds an empty string, which would stop at once");
}

// Fields of OpenAI's API this server does not implement: refused when asked
// for, so a client never gets silently less than it requested.
void refuse_unsupported(const json& body) {
  if (auto n = integer(body, "n", 1, 1)) (void)n;
  if (auto b = integer(body, "best_of", 1, 1)) (void)b;
  if (const json* v = field(body, "logprobs"); v && !(v->is_boolean() && !v->get<bool>()))
    refuse("logprobs", "'logprobs' is not supported");
  if (const json* v = field(body, "top_logprobs"); v) refuse("top_logprobs", "'top_logprobs' is not supported");
  if (boolean(body, "echo").value_or(false)) refuse("echo", "'echo' is not supported");
  if (const json* v = field(body, "suffix"); v) refuse("suffix", "'suffix' is not supported");
  if (const json* v = field(body, "tools"); v && !(v->is_array() && v->empty()))
    refuse("tools", "'tools' is not supported");
  if (const json* v = field(body, "logit_bias"); v && !(v->is_object() && v->empty()))
    refuse("logit_bias", "'logit_bias' is not supported");
}

// check_sampling_params names the CLI flag; a client knows the field.
std::string field_message(std::string msg) {
  static const std::pair<const char*, const char*> names[] = {
      {"--temp", "temperature"}, {"--top-k", "top_k"}, {"--top-p", "top_p"}, {"--min-p", "min_p"},
      {"--repeat-penalty", "repeat_penalty"}, {"--presence-penalty", "presence_penalty"},
      {"--frequency-penalty", "frequency_penalty"}, {"--repeat-last-n", "repeat_last_n"}};
  for (const auto& [flag, name] : names) {
    const std::string f = flag;
    if (msg.compare(0, f.size() + 1, f + " ") == 0) return "'" + std::string(name) + "'" + msg.substr(f.size());
  }
  return msg;
}

std::string field_of(const std::string& msg) {
  if (msg.size() > 2 && msg[0] == '\'') return msg.substr(1, msg.find('\'', 1) - 1);
  return {};
}

GenerateRequest parse(const json& body, bool chat, const SamplingParams& defaults) {
  if (!body.is_object()) refuse("", std::string("the body must be a JSON object, got ") + type_name(body));
  GenerateRequest r;
  r.chat = chat;
  r.sampling = defaults;
  r.model = text(body, "model").value_or("");
  if (chat) {
    read_messages(body, r);
  } else {
    read_prompt(body, r);
  }
  refuse_unsupported(body);
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens = integer(body, "max_tokens", 1, kInt32);
  if (chat) {
    if (auto m = integer(body, "max_completion_tokens", 1, kInt32)) max_tokens = m;
  }
  r.max_tokens = max_tokens;
  SamplingParams& sp = r.sampling;
  if (auto v = number(body, "temperature")) sp.temperature = static_cast<float>(*v);
  if (auto v = integer(body, "top_k", 0, kInt32)) sp.top_k = static_cast<int>(*v);
  if (auto v = number(body, "top_p")) sp.top_p = static_cast<float>(*v);
  if (auto v = number(body, "min_p")) sp.min_p = static_cast<float>(*v);
  if (auto v = number(body, "repeat_penalty")) sp.repeat_penalty = static_cast<float>(*v);
  if (auto v = number(body, "presence_penalty")) sp.presence_penalty = static_cast<float>(*v);
  if (auto v = number(body, "frequency_penalty")) sp.frequency_penalty = static_cast<float>(*v);
  if (auto v = integer(body, "repeat_last_n", -1, kInt32)) sp.penalty_last_n = static_cast<int>(*v);
  if (const std::string why = check_sampling_params(sp); !why.empty()) {
    const std::string msg = field_message(why);
    refuse(field_of(msg), msg);
  }
  if (auto v = integer(body, "seed", 0, std::numeric_limits<int64_t>::max())) r.seed = static_cast<uint64_t>(*v);
  read_stop(body, r);
  r.stream = boolean(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) refuse("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  r.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  return r;
}

}  // namespace

std::variant<GenerateRequest, ApiError> parse_generate_request(std::string_view body, bool chat,
                                                               const SamplingParams& defaults) {
  // allow_exceptions = false: a malformed body is a value, not a throw.
  const json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) return ApiError{400, "the body is not valid JSON", "invalid_request_error", "", ""};
  try {
    return parse(j, chat, defaults);
  } catch (const Refusal& r) {
    return r.error;
  } catch (const json::exception& e) {
    // A type the checks above let through by mistake is still the client's 400.
    return ApiError{400, std::string("bad request: ") + e.what(), "invalid_request_error", "", ""};
  }
}

}  // namespace xrun
