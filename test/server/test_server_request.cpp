// The server's request parser (server_request.cpp) on good and hostile bodies,
// and the response helpers (server_openai.cpp): no model, no sockets.
#include <doctest/doctest.h>

#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server_openai.h"
#include "server_request.h"

using xrun::ApiError;
using xrun::GenerateRequest;

namespace {

xrun::SamplingParams defaults() {
  xrun::SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 40;
  return p;
}

GenerateRequest accepted(const std::string& body, bool chat = false) {
  auto r = xrun::parse_generate_request(body, chat, defaults());
  if (const ApiError* e = std::get_if<ApiError>(&r)) FAIL("refused: " << e->message << " (" << body << ")");
  return std::get<GenerateRequest>(r);
}

ApiError refused(const std::string& body, bool chat = false) {
  auto r = xrun::parse_generate_request(body, chat, defaults());
  REQUIRE_MESSAGE(std::holds_alternative<ApiError>(r), "accepted: " << body);
  const ApiError e = std::get<ApiError>(r);
  CHECK(e.status == 400);
  CHECK(e.type == "invalid_request_error");
  CHECK(!e.message.empty());
  return e;
}

}  // namespace

TEST_CASE("completions: the prompt forms of the OpenAI API") {
  CHECK(*accepted(R"({"prompt": "Once"})").prompt == "Once");
  CHECK(*accepted(R"({"prompt": ["Once"]})").prompt == "Once");
  CHECK(*accepted(R"({"prompt": [1, 2, 3]})").prompt_ids == std::vector<int32_t>{1, 2, 3});
  CHECK(*accepted(R"({"prompt": [[1, 2]]})").prompt_ids == std::vector<int32_t>{1, 2});
  CHECK(refused(R"({"prompt": ["a", "b"]})").message.find("one prompt per request") != std::string::npos);
  CHECK(refused(R"({})").param == "prompt");
  CHECK(refused(R"({"prompt": null})").param == "prompt");
  CHECK(refused(R"({"prompt": 7})").param == "prompt");
  CHECK(refused(R"({"prompt": []})").param == "prompt");
  CHECK(refused(R"({"prompt": [1, -2]})").param == "prompt");
  CHECK(refused(R"({"prompt": [1, 2.5]})").param == "prompt");
  CHECK(refused(R"({"prompt": [1, 99999999999]})").param == "prompt");
  CHECK(refused(R"({"prompt": [1, "x"]})").param == "prompt");
}

TEST_CASE("the sampling fields override the command line's, checked by field name") {
  GenerateRequest r = accepted(
      R"({"prompt": "x", "temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1,
          "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_last_n": -1, "seed": 42, "max_tokens": 9,
          "stop": ["a", "bc"], "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
          "model": "m", "user": "anyone", "n": 1, "logprobs": null, "echo": false})");
  CHECK(r.sampling.temperature == doctest::Approx(0.7));
  CHECK(r.sampling.top_k == 5);
  CHECK(r.sampling.top_p == doctest::Approx(0.9));
  CHECK(r.sampling.min_p == doctest::Approx(0.05));
  CHECK(r.sampling.repeat_penalty == doctest::Approx(1.1));
  CHECK(r.sampling.presence_penalty == doctest::Approx(0.5));
  CHECK(r.sampling.frequency_penalty == doctest::Approx(-0.5));
  CHECK(r.sampling.penalty_last_n == -1);
  CHECK(*r.seed == 42);
  CHECK(*r.max_tokens == 9);
  CHECK(r.stop == std::vector<std::string>{"a", "bc"});
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.ignore_eos);
  CHECK(r.model == "m");
  // Absent fields keep the command line's values.
  GenerateRequest d = accepted(R"({"prompt": "x", "stop": "only"})");
  CHECK(d.sampling.top_k == 40);
  CHECK(d.sampling.temperature == 0.0f);
  CHECK(!d.seed);
  CHECK(!d.max_tokens);
  CHECK(d.stop == std::vector<std::string>{"only"});
  CHECK(!d.stream);
}

TEST_CASE("wrong types, out-of-range values and unsupported features answer 400 naming the field") {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1e30})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})", "max_tokens"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": -1})", "temperature"},
      {R"({"prompt": "x", "temperature": true})", "temperature"},
      {R"({"prompt": "x", "temperature": 1e300})", "temperature"},
      {R"({"prompt": "x", "top_p": -1e39})", "top_p"},
      {R"({"prompt": "x", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "x", "top_k": -3})", "top_k"},
      {R"({"prompt": "x", "min_p": 2})", "min_p"},
      {R"({"prompt": "x", "repeat_penalty": 0})", "repeat_penalty"},
      {R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "x", "frequency_penalty": -2.5})", "frequency_penalty"},
      {R"({"prompt": "x", "repeat_last_n": -2})", "repeat_last_n"},
      {R"({"prompt": "x", "seed": -1})", "seed"},
      {R"({"prompt": "x", "seed": "1"})", "seed"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stop": [""]})", "stop"},
      {R"({"prompt": "x", "stop": ["a", 1]})", "stop"},
      {R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})", "stop"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stream_options": 1})", "stream_options"},
      {R"({"prompt": "x", "model": 5})", "model"},
      {R"({"prompt": "x", "n": 2})", "n"},
      {R"({"prompt": "x", "best_of": 3})", "best_of"},
      {R"({"prompt": "x", "logprobs": 5})", "logprobs"},
      {R"({"prompt": "x", "echo": true})", "echo"},
      {R"({"prompt": "x", "suffix": "s"})", "suffix"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    CHECK(refused(c.body).param == c.param);
  }
}

TEST_CASE("bodies that are not a JSON object") {
  for (const char* b : {"", "{", "{\"prompt\": \"x\",}", "[1,2]", "\"x\"", "null", "42", "{\"prompt\": \"\xff\xfe\"}",
                        "{\"prompt\": \"x\"} trailing"}) {
    CAPTURE(b);
    refused(b);
  }
  // Deep nesting is parsed iteratively by nlohmann-json: refused, not a stack overflow.
  refused(std::string(200000, '[') + std::string(200000, ']'));
  refused("{\"prompt\": " + std::string(200000, '[') + std::string(200000, ']') + "}");
}

TEST_CASE("chat: messages and their content parts") {
  GenerateRequest r = accepted(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
                       {"role": "assistant", "content": null, "reasoning_content": "hm"}],
          "max_completion_tokens": 7})",
      true);
  REQUIRE(r.messages.size() == 3);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].content == "Hi!");
  CHECK(r.messages[2].content.empty());
  CHECK(r.messages[2].reasoning == "hm");
  CHECK(*r.max_tokens == 7);
  CHECK(refused(R"({"messages": []})", true).param == "messages");
  CHECK(refused(R"({"messages": "hi"})", true).param == "messages");
  CHECK(refused(R"({"prompt": "hi"})", true).param == "messages");
  CHECK(refused(R"({"messages": [1]})", true).param == "messages[0]");
  CHECK(refused(R"({"messages": [{"content": "x"}]})", true).param == "messages[0].role");
  CHECK(refused(R"({"messages": [{"role": 3, "content": "x"}]})", true).param == "messages[0].role");
  CHECK(refused(R"({"messages": [{"role": "user", "content": 3}]})", true).param == "messages[0].content");
  CHECK(refused(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true).param ==
        "messages[0].content");
  CHECK(refused(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", true).param ==
        "tools");
  CHECK(refused(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -5})", true).param ==
        "max_completion_tokens");
}

TEST_CASE("response objects have the OpenAI API's shape") {
  xrun::ResponseHead h{"cmpl-1", 1700000000, "stories", false};
  nlohmann::ordered_json c = xrun::completion_json(h, "abc", "length", {2, 3});
  CHECK(c["object"] == "text_completion");
  CHECK(c["choices"][0]["text"] == "abc");
  CHECK(c["choices"][0]["finish_reason"] == "length");
  CHECK(c["usage"]["total_tokens"] == 5);
  h.chat = true;
  nlohmann::ordered_json m = xrun::completion_json(h, "hi", "stop", {1, 1});
  CHECK(m["object"] == "chat.completion");
  CHECK(m["choices"][0]["message"]["role"] == "assistant");
  CHECK(m["choices"][0]["message"]["content"] == "hi");
  nlohmann::ordered_json first = xrun::chunk_json(h, "", "", true);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["finish_reason"].is_null());
  nlohmann::ordered_json last = xrun::chunk_json(h, "", "stop", false);
  CHECK(last["choices"][0]["delta"].empty());
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  CHECK(xrun::usage_chunk_json(h, {4, 5})["choices"].empty());
  nlohmann::ordered_json e = xrun::error_json({400, "bad", "invalid_request_error", "max_tokens", ""});
  CHECK(e["error"]["message"] == "bad");
  CHECK(e["error"]["param"] == "max_tokens");
  CHECK(e["error"]["code"].is_null());
  CHECK(xrun::models_json("m", 5)["data"][0]["id"] == "m");
  CHECK(xrun::sse_event({{"a", 1}}) == "data: {\"a\":1}\n\n");
}

TEST_CASE("streamed text splits only on UTF-8 character boundaries; ill-formed bytes become U+FFFD") {
  CHECK(xrun::utf8_complete_prefix("abc") == 3);
  CHECK(xrun::utf8_complete_prefix("") == 0);
  const std::string e_acute = "\xc3\xa9", euro = "\xe2\x82\xac", smile = "\xf0\x9f\x98\x80";
  CHECK(xrun::utf8_complete_prefix("a" + e_acute) == 3);
  CHECK(xrun::utf8_complete_prefix("a" + e_acute.substr(0, 1)) == 1);
  CHECK(xrun::utf8_complete_prefix("a" + euro.substr(0, 2)) == 1);
  CHECK(xrun::utf8_complete_prefix("a" + smile.substr(0, 3)) == 1);
  CHECK(xrun::utf8_complete_prefix("a" + smile) == 5);
  CHECK(xrun::utf8_complete_prefix("\x80\x80\x80\x80") == 4);  // stray continuations are not held back forever
  CHECK(xrun::dump_json(nlohmann::ordered_json("a\xff")) == "\"a\xef\xbf\xbd\"");
}
