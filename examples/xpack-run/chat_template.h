// Chat messages -> prompt text, in the format a model was trained on. The GGUF's
// `tokenizer.chat_template` (Jinja) only tells which format it is: each known
// format is rendered natively, so the product carries no Jinja interpreter. No
// I/O: the CLI's -cnv and the server share it.
//
// Where each format's reference template came from, and what is not rendered
// (tools, images): doc/xpack-run.md, "Chat templates". test/runtime/
// test_chat_template.cpp renders the same messages through Python's jinja2 with
// the reference template strings and requires identical text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xrun {

enum class ChatFormat {
  kDeepSeekV4,  // <｜User｜>... <｜Assistant｜></think>...<｜end▁of▁sentence｜>
  kKimiK3,      // <|open|>message role="user"<|sep|>...<|close|>message<|sep|><|end_of_msg|>
  kChatML,      // <|im_start|>user\n...<|im_end|>\n
  kPlain,       // "User: ...\nAssistant: ...\n": no template, or one not recognised
};

struct ChatMessage {
  std::string role;       // system, user, assistant (DeepSeek-V4 also: developer; ChatML: any)
  std::string content;
  std::string reasoning;  // an assistant turn's thinking (reasoning_content); may be empty
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the opening of an assistant turn
  // nullopt = the template's own default: DeepSeek-V4 off, Kimi-K3 on.
  std::optional<bool> thinking;
  // Kimi-K3 with thinking: low, medium, high or max (the template's default);
  // empty = no effort message.
  std::string thinking_effort = "max";
  // DeepSeek-V4's text starts with it ({{ bos_token }}); empty where the
  // tokenizer adds BOS itself.
  std::string bos_token;
};

// The format of a template string by its markers (empty -> kPlain).
ChatFormat detect_chat_format(std::string_view jinja_template);
// "deepseek-v4", "kimi-k3", "chatml", "plain".
const char* chat_format_name(ChatFormat f);
std::optional<ChatFormat> chat_format_from_name(std::string_view name);

// The prompt text. Throws std::invalid_argument for what the format cannot
// carry (a role it does not know, an empty role, an unknown thinking effort).
std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages, const ChatOptions& opt = {});

// Text that ends an assistant turn where the model may write it as text rather
// than end-of-sequence (stop strings for a chat turn; may be empty).
std::vector<std::string> chat_turn_stops(ChatFormat f);

}  // namespace xrun
