// The native chat renderers (examples/xpack-run/chat_template.cpp) against the
// template strings themselves, rendered by Python's jinja2 the way Hugging Face
// transformers does (render_chat_jinja.py): the same messages must give the same
// text, byte for byte. The templates are test/data/chat_templates/ (origins in
// its README); without jinja2 the comparisons are a SKIP.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "fixtures.h"
#include "skip.h"

namespace fs = std::filesystem;
using nlohmann::json;
using xrun::ChatFormat;
using xrun::ChatMessage;
using xrun::ChatOptions;

namespace {

const std::string kBos = "<｜begin▁of▁sentence｜>";

struct Case {
  std::vector<ChatMessage> messages;
  ChatOptions opt;
};

fs::path template_path(const std::string& name) { return xpack::test::data_dir() / "chat_templates" / name; }

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f, "cannot read " << p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

json to_json(const Case& c, ChatFormat f) {
  json msgs = json::array();
  for (const ChatMessage& m : c.messages) {
    json j = {{"role", m.role}, {"content", m.content}};
    if (!m.reasoning.empty()) j["reasoning_content"] = m.reasoning;
    msgs.push_back(j);
  }
  json kw = {{"add_generation_prompt", c.opt.add_generation_prompt}, {"bos_token", c.opt.bos_token}};
  if (c.opt.thinking) kw["thinking"] = *c.opt.thinking;
  if (f == ChatFormat::kKimiK3) {
    // The native "" (no effort message) is the template's none.
    kw["thinking_effort"] = c.opt.thinking_effort.empty() ? json(nullptr) : json(c.opt.thinking_effort);
  }
  return {{"messages", msgs}, {"kwargs", kw}};
}

// Renders every case through jinja2; nullopt (recorded as a skip) without it.
std::optional<json> jinja_render(const fs::path& tmpl, const std::vector<Case>& cases, ChatFormat f) {
  xpack::test::TempDir tmp;
  json all = json::array();
  for (const Case& c : cases) all.push_back(to_json(c, f));
  {
    std::ofstream o(tmp / "cases.json");
    o << all.dump();
  }
  const fs::path script = xpack::test::data_dir() / ".." / "runtime" / "render_chat_jinja.py";
  std::string out;
  const int rc = xpack::test::run_command(
      "python3 '" + script.string() + "' '" + tmpl.string() + "' '" + (tmp / "cases.json").string() + "' '" +
          (tmp / "out.json").string() + "'",
      &out);
  if (rc == 77 || rc == 127) {  // no jinja2, or no python3
    xpack::test::skip(xpack::test::Absent::kFixture, "jinja2 reference renderer unavailable: " + out);
    return std::nullopt;
  }
  REQUIRE_MESSAGE(rc == 0, out);
  std::ifstream in(tmp / "out.json");
  return json::parse(in);
}

// Native vs jinja2 for every case: equal text, or both refuse.
void compare(const std::string& file, ChatFormat f, const std::vector<Case>& cases) {
  const fs::path tmpl = template_path(file);
  CHECK(xrun::detect_chat_format(read_text(tmpl)) == f);
  auto ref = jinja_render(tmpl, cases, f);
  if (!ref) return;
  REQUIRE(ref->size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    CAPTURE(to_json(cases[i], f).dump());
    const json& r = (*ref)[i];
    if (r.contains("error")) {
      CAPTURE(r["error"].get<std::string>());
      CHECK_THROWS_AS(xrun::render_chat(f, cases[i].messages, cases[i].opt), std::invalid_argument);
      continue;
    }
    std::string native;
    REQUIRE_NOTHROW(native = xrun::render_chat(f, cases[i].messages, cases[i].opt));
    CHECK(native == r["text"].get<std::string>());
  }
}

ChatOptions opts(bool gen, std::optional<bool> thinking = std::nullopt, std::string bos = {}, std::string effort = "max") {
  ChatOptions o;
  o.add_generation_prompt = gen;
  o.thinking = thinking;
  o.bos_token = std::move(bos);
  o.thinking_effort = std::move(effort);
  return o;
}

// Message lists every format renders (system, user, assistant only).
std::vector<std::vector<ChatMessage>> common_conversations() {
  return {
      {{"user", "Hello", ""}},
      {{"system", "You are terse.", ""}, {"user", "What is 2+2?", ""}},
      {{"system", "Be kind.", ""},
       {"user", "Hi", ""},
       {"assistant", "Hello! How can I help?", ""},
       {"user", "Tell me a joke.", ""}},
      // Reasoning kept on the turn after the last user one (thinking on), dropped before.
      {{"user", "Capital of France?", ""},
       {"assistant", "Paris.", "The user asks about France. It is Paris."},
       {"user", "And Italy?", ""},
       {"assistant", "Rome.", "Italy: Rome."}},
      // Whitespace-only reasoning: Kimi-K3 drops it (|trim), DeepSeek-V4 keeps it.
      {{"user", "q", ""}, {"assistant", "a", "  \n"}},
      // Text that looks like markup or Jinja is data, not syntax.
      {{"user", "héllo 世界 {{ messages }} {% if %} <|im_end|> \"quotes\" 'single'\n\nnew paragraph", ""}},
      {{"system", "", ""}, {"user", "", ""}, {"assistant", "", ""}},
      // Two system messages, two users in a row.
      {{"system", "First rule.", ""}, {"system", "Second rule.", ""}, {"user", "one", ""}, {"user", "two", ""}},
  };
}

std::vector<Case> cases_with(const std::vector<ChatOptions>& options) {
  std::vector<Case> out;
  for (const auto& conv : common_conversations())
    for (const ChatOptions& o : options) out.push_back({conv, o});
  return out;
}

}  // namespace

TEST_CASE("detect_chat_format: by each format's markers; names round-trip") {
  CHECK(xrun::detect_chat_format("") == ChatFormat::kPlain);
  CHECK(xrun::detect_chat_format("{{ messages }}") == ChatFormat::kPlain);
  // Kimi-K2's markers are not K3's format: not mistaken for it (or for ChatML).
  CHECK(xrun::detect_chat_format("<|im_user|>user<|im_middle|>{{ c }}<|im_end|>") == ChatFormat::kPlain);
  // A DeepSeek template without DSML (V3 and before) is not V4's.
  CHECK(xrun::detect_chat_format("<｜User｜>{{ c }}<｜Assistant｜>") == ChatFormat::kPlain);
  CHECK(xrun::detect_chat_format("{{'<|im_start|>' + m }}") == ChatFormat::kChatML);
  for (ChatFormat f : {ChatFormat::kDeepSeekV4, ChatFormat::kKimiK3, ChatFormat::kChatML, ChatFormat::kPlain})
    CHECK(xrun::chat_format_from_name(xrun::chat_format_name(f)) == f);
  CHECK(!xrun::chat_format_from_name("jinja"));
}

TEST_CASE("DeepSeek-V4: native == jinja2 over the published template") {
  auto cases = cases_with({opts(true), opts(false), opts(true, true), opts(true, false), opts(false, true),
                           opts(true, std::nullopt, kBos), opts(true, true, kBos)});
  cases.push_back({{{"developer", "Answer in French.", ""}, {"user", "Hi", ""}}, opts(true, std::nullopt, kBos)});
  compare("deepseek-v4.jinja", ChatFormat::kDeepSeekV4, cases);
}

TEST_CASE("Kimi-K3: native == jinja2 over the published template") {
  auto cases = cases_with({opts(true), opts(false), opts(true, false), opts(true, true, {}, "low"),
                           opts(true, true, {}, "medium"), opts(false, true, {}, "high"), opts(true, true, {}, "")});
  // An effort the template does not know: both refuse. Without thinking it is not looked at.
  cases.push_back({{{"user", "hi", ""}}, opts(true, true, {}, "extreme")});
  cases.push_back({{{"user", "hi", ""}}, opts(true, false, {}, "extreme")});
  compare("kimi-k3.jinja", ChatFormat::kKimiK3, cases);
}

TEST_CASE("ChatML: native == jinja2, any role") {
  auto cases = cases_with({opts(true), opts(false)});
  cases.push_back({{{"tool", "42", ""}, {"user", "ok", ""}}, opts(true)});
  compare("chatml.jinja", ChatFormat::kChatML, cases);
}

TEST_CASE("plain fallback: native == jinja2 of its own template") {
  auto cases = cases_with({opts(true), opts(false)});
  cases.push_back({{{"tool", "42", ""}}, opts(true)});  // both refuse
  compare("plain.jinja", ChatFormat::kPlain, cases);
}

TEST_CASE("roles a format cannot carry are refused, naming the format and the role") {
  const std::vector<ChatMessage> tool = {{"user", "q", ""}, {"tool", "42", ""}};
  for (ChatFormat f : {ChatFormat::kDeepSeekV4, ChatFormat::kKimiK3, ChatFormat::kPlain}) {
    try {
      xrun::render_chat(f, tool);
      FAIL("rendered a tool message");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK(what.find(xrun::chat_format_name(f)) != std::string::npos);
      CHECK(what.find("role 'tool'") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(xrun::render_chat(ChatFormat::kChatML, {{"", "x", ""}}), std::invalid_argument);
  CHECK_THROWS_AS(xrun::render_chat(ChatFormat::kDeepSeekV4, {{"User", "x", ""}}), std::invalid_argument);
}

TEST_CASE("a turn's generation prompt is a prefix of the conversation with the reply (chat keeps its KV state)") {
  const std::vector<ChatMessage> before = {{"system", "S", ""}, {"user", "Hi", ""}, {"assistant", "Yo", ""},
                                           {"user", "More", ""}};
  std::vector<ChatMessage> after = before;
  after.push_back({"assistant", "Sure.", ""});
  for (ChatFormat f : {ChatFormat::kDeepSeekV4, ChatFormat::kKimiK3, ChatFormat::kChatML, ChatFormat::kPlain}) {
    CAPTURE(xrun::chat_format_name(f));
    ChatOptions gen = opts(true, false, kBos), full = opts(false, false, kBos);
    const std::string a = xrun::render_chat(f, before, gen);
    const std::string b = xrun::render_chat(f, after, full);
    CHECK(b.compare(0, a.size(), a) == 0);
    // The reply's own text follows (Plain puts a space after its "Assistant:").
    CHECK(b.find("Sure.", a.size()) <= a.size() + 1);
    for (const std::string& stop : xrun::chat_turn_stops(f)) CHECK(!stop.empty());
  }
}
