#include "chat_template.h"

#include <stdexcept>

namespace xrun {

namespace {

bool has(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

[[noreturn]] void refuse(ChatFormat f, const std::string& why) {
  throw std::invalid_argument(std::string("chat template ") + chat_format_name(f) + ": " + why);
}

// Python's str.strip() is not empty (the Kimi-K3 template's `|trim` test).
bool has_non_space(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') return true;
  return false;
}

// DeepSeek-V4, as its template writes it: every system message joined at the
// top after the BOS; consecutive user turns merged with a blank line; an
// assistant turn is `</think>` + content + EOS, or with thinking on, for the
// turns after the last user one, `<think>` + reasoning + `</think>` + content.
std::string deepseek_v4(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  const bool thinking = opt.thinking.value_or(false);
  std::string system;
  bool first_system = true;
  int last_user = -1;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      system += (first_system ? "" : "\n\n") + m.content;
      first_system = false;
    } else if (m.role == "user" || m.role == "developer") {
      last_user = static_cast<int>(i);
    } else if (m.role != "assistant") {
      refuse(ChatFormat::kDeepSeekV4, "role '" + m.role + "' is not rendered (system, developer, user, assistant)");
    }
  }
  std::string out = opt.bos_token + system;
  bool in_user = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user" || m.role == "developer") {
      out += in_user ? "\n\n" : "<｜User｜>";
      in_user = true;
      out += m.content;
    } else if (m.role == "assistant") {
      in_user = false;
      out += "<｜Assistant｜>";
      if (thinking && static_cast<int>(i) > last_user) {
        out += "<think>" + m.reasoning + "</think>";
      } else {
        out += "</think>";
      }
      out += m.content + "<｜end▁of▁sentence｜>";
    }
  }
  if (opt.add_generation_prompt) out += std::string("<｜Assistant｜>") + (thinking ? "<think>" : "</think>");
  return out;
}

std::string kimi_open(const std::string& tag, const std::string& role = {}, const std::string& type = {}) {
  std::string s = "<|open|>" + tag;
  if (!role.empty()) s += " role=\"" + role + "\"";
  if (!type.empty()) s += " type=\"" + type + "\"";
  return s + "<|sep|>";
}

std::string kimi_close(const std::string& tag) { return "<|close|>" + tag + "<|sep|>"; }

// Kimi-K3's tagged messages. With thinking (the default) the template first
// writes a system message stating the effort, and every assistant turn carries
// a think channel before its response channel.
std::string kimi_k3(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  const bool thinking = opt.thinking.value_or(true);
  const std::string& effort = opt.thinking_effort;
  const bool effort_ok = effort == "low" || effort == "medium" || effort == "high" || effort == "max";
  if (thinking && !effort.empty() && !effort_ok)
    refuse(ChatFormat::kKimiK3, "thinking effort '" + effort + "' is not one of low, medium, high, max");
  std::string out;
  if (thinking && effort_ok) {
    out += kimi_open("message", "system", "thinking-effort") +
           "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
           "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
           "`thinking_effort=" +
           effort + "`." + kimi_close("message") + "<|end_of_msg|>";
  }
  for (const ChatMessage& m : msgs) {
    if (m.role == "user" || m.role == "system") {
      out += kimi_open("message", m.role) + m.content + kimi_close("message") + "<|end_of_msg|>";
    } else if (m.role == "assistant") {
      out += kimi_open("message", "assistant");
      if (thinking) {
        out += kimi_open("think");
        if (has_non_space(m.reasoning)) out += m.reasoning;
        out += kimi_close("think");
      }
      out += kimi_open("response") + m.content + kimi_close("response") + kimi_close("message") + "<|end_of_msg|>";
    } else {
      refuse(ChatFormat::kKimiK3, "role '" + m.role + "' is not rendered (system, user, assistant)");
    }
  }
  if (opt.add_generation_prompt) out += kimi_open("message", "assistant") + kimi_open(thinking ? "think" : "response");
  return out;
}

std::string chatml(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    if (m.role.empty()) refuse(ChatFormat::kChatML, "a message has an empty role");
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string plain(const std::vector<ChatMessage>& msgs, const ChatOptions& opt) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      out += m.content + "\n\n";
    } else if (m.role == "user") {
      out += "User: " + m.content + "\n";
    } else if (m.role == "assistant") {
      out += "Assistant: " + m.content + "\n";
    } else {
      refuse(ChatFormat::kPlain, "role '" + m.role + "' is not rendered (system, user, assistant)");
    }
  }
  if (opt.add_generation_prompt) out += "Assistant:";
  return out;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view t) {
  // Kimi-K3's tags replaced K2's <|im_user|> markers; DeepSeek-V4's DSML tool
  // markup sets it apart from DeepSeek templates before V3.2.
  if (has(t, "<|open|>") && has(t, "<|end_of_msg|>")) return ChatFormat::kKimiK3;
  if (has(t, "<｜User｜>") && has(t, "<｜Assistant｜>") && has(t, "｜DSML｜")) return ChatFormat::kDeepSeekV4;
  if (has(t, "<|im_start|>")) return ChatFormat::kChatML;
  return ChatFormat::kPlain;
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kDeepSeekV4: return "deepseek-v4";
    case ChatFormat::kKimiK3: return "kimi-k3";
    case ChatFormat::kChatML: return "chatml";
    case ChatFormat::kPlain: return "plain";
  }
  return "plain";
}

std::optional<ChatFormat> chat_format_from_name(std::string_view name) {
  for (ChatFormat f : {ChatFormat::kDeepSeekV4, ChatFormat::kKimiK3, ChatFormat::kChatML, ChatFormat::kPlain})
    if (name == chat_format_name(f)) return f;
  return std::nullopt;
}

std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages, const ChatOptions& opt) {
  switch (f) {
    case ChatFormat::kDeepSeekV4: return deepseek_v4(messages, opt);
    case ChatFormat::kKimiK3: return kimi_k3(messages, opt);
    case ChatFormat::kChatML: return chatml(messages, opt);
    case ChatFormat::kPlain: return plain(messages, opt);
  }
  return plain(messages, opt);
}

std::vector<std::string> chat_turn_stops(ChatFormat f) {
  switch (f) {
    case ChatFormat::kDeepSeekV4: return {"<｜end▁of▁sentence｜>", "<｜User｜>"};
    case ChatFormat::kKimiK3: return {"<|close|>response<|sep|>", "<|end_of_msg|>"};
    case ChatFormat::kChatML: return {"<|im_end|>"};
    case ChatFormat::kPlain: return {"\nUser:"};
  }
  return {};
}

}  // namespace xrun
