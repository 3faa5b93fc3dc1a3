// xpack-run end to end on stories260K: -cnv (turns from stdin, the state kept
// across turns), --stop, the random seed, -c, -f and the timing lines.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "fixtures.h"
#include "runtime_harness.h"
#include "skip.h"

using namespace xrun_test;
using nlohmann::json;

namespace {

std::string xrun(const std::string& args) { return q(xpack_run_exe()) + " " + args; }

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
  REQUIRE(f.good());
}

json run_json(const std::string& args) {
  RunResult r = run(xrun(args));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  return json::parse(r.out);
}

#define NEED_STORIES()                                                                \
  auto model = stories260k();                                                         \
  if (!model) {                                                                       \
    xpack::test::skip(xpack::test::Absent::kFixture, "stories260K.gguf not found");   \
    return;                                                                           \
  }

}  // namespace

TEST_CASE("-cnv: each reply is what a one-shot run of the rendered conversation gives; the state is kept") {
  NEED_STORIES();
  xpack::test::TempDir tmp;
  write_text(tmp / "turns.txt", "Hi\n\nTell me a story\n");  // the empty line is skipped
  RunResult r = run(xrun("-m " + q(*model) + " -cnv -n 24 --json < " + q(tmp / "turns.txt")));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const json chat = json::parse(r.out);
  CHECK(chat["chat_format"] == "plain");  // stories260K has no tokenizer.chat_template
  CHECK(r.err.find("chat format plain (the model has no tokenizer.chat_template)") != std::string::npos);
  REQUIRE(chat["turns"].size() == 2);
  const json& t1 = chat["turns"][0];
  const json& t2 = chat["turns"][1];
  CHECK(t1["user"] == "Hi");
  CHECK(t1["reused_tokens"] == 0);
  // Turn 2 starts from turn 1's state: its prompt and every fed-back reply token.
  const size_t fed1 = t1["gen_ids"].size() - (t1["finish_reason"] == "length" ? 0 : 1);
  CHECK(t2["reused_tokens"] == t1["prompt_tokens"].get<size_t>() + fed1);
  CHECK(chat["resets"] == 0);

  // The same turns as one-shot prompts (the plain format: "User: ...\nAssistant:").
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t\r\n"));
    s.erase(s.find_last_not_of(" \t\r\n") + 1);
    return s;
  };
  write_text(tmp / "p1.txt", "User: Hi\nAssistant:");
  json one = run_json("-m " + q(*model) + " -f " + q(tmp / "p1.txt") + " -n 24 --json --stop " + q("\nUser:"));
  CHECK(one["gen_ids"] == t1["gen_ids"]);
  CHECK(one["text"] == t1["reply"]);
  write_text(tmp / "p2.txt", "User: Hi\nAssistant: " + trim(t1["reply"].get<std::string>()) +
                                 "\nUser: Tell me a story\nAssistant:");
  json two = run_json("-m " + q(*model) + " -f " + q(tmp / "p2.txt") + " -n 24 --json --stop " + q("\nUser:"));
  CHECK(two["prompt_ids"].size() == t2["prompt_tokens"]);
  CHECK(two["gen_ids"] == t2["gen_ids"]);

  // Without --json the replies stream to stdout, one per turn; the timings go to stderr.
  r = run(xrun("-m " + q(*model) + " -cnv -n 24 < " + q(tmp / "turns.txt")));
  REQUIRE(r.rc == 0);
  CHECK(r.out == t1["reply"].get<std::string>() + "\n" + t2["reply"].get<std::string>() + "\n");
  CHECK(r.err.find("prompt eval time =") != std::string::npos);
  CHECK(r.err.find("-cnv: 2 turns") != std::string::npos);
}

TEST_CASE("-cnv: -p is the system message; a conversation over -c ends the chat") {
  NEED_STORIES();
  xpack::test::TempDir tmp;
  write_text(tmp / "turns.txt", "Hi\n");
  json chat = run_json("-m " + q(*model) + " -cnv -p " + q("You tell stories.") + " -n 8 --json < " +
                       q(tmp / "turns.txt"));
  write_text(tmp / "p.txt", "You tell stories.\n\nUser: Hi\nAssistant:");
  json one = run_json("-m " + q(*model) + " -f " + q(tmp / "p.txt") + " -n 8 --json --stop " + q("\nUser:"));
  CHECK(one["gen_ids"] == chat["turns"][0]["gen_ids"]);

  RunResult r = run(xrun("-m " + q(*model) + " -cnv -c 6 -n 8 --json < " + q(tmp / "turns.txt")));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("the context holds 6: chat ended") != std::string::npos);
  CHECK(json::parse(r.out)["turns"].empty());
}

TEST_CASE("--stop: the text ends before the stop string, which is not printed") {
  NEED_STORIES();
  // Greedy "Once" continues " upon a time, there was a little girl named Lily. ..."
  json j = run_json("-m " + q(*model) + " -p Once -n 60 --json --stop Lily --stop " + q("never appears"));
  CHECK(j["text"] == " upon a time, there was a little girl named ");
  CHECK(j["finish_reason"] == "stop");
  CHECK(j["gen_ids"].size() < 60);
  RunResult r = run(xrun("-m " + q(*model) + " -p Once -n 60 --stop Lily"));
  REQUIRE(r.rc == 0);
  CHECK(r.out == " upon a time, there was a little girl named \n");
  j = run_json("-m " + q(*model) + " -p Once -n 5 --json");
  CHECK(j["finish_reason"] == "length");
}

TEST_CASE("--seed: random when not given, printed on stderr and in --json, and then reproducible") {
  NEED_STORIES();
  RunResult r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 30 --temp 1 --top-k 40 --json"));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const json a = json::parse(r.out);
  const uint64_t seed = a["seed"].get<uint64_t>();
  CHECK(r.err.find("xpack-run: seed " + std::to_string(seed) + "\n") != std::string::npos);
  const json b = run_json("-m " + q(*model) + " --prompt-ids 1,403 -n 30 --temp 1 --top-k 40 --json --seed " +
                          std::to_string(seed));
  CHECK(b["gen_ids"] == a["gen_ids"]);
  CHECK(b["seed"] == seed);
  r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 3 --temp 1 --seed 5"));
  CHECK(r.err.find("xpack-run: seed") == std::string::npos);  // given, so not printed
}

TEST_CASE("-c within the model's context; -f reads the prompt; the timing lines") {
  NEED_STORIES();
  xpack::test::TempDir tmp;
  RunResult r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403 -n 4 -c 4096"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("-c 4096 is more than the model's context of 2048 (llama.context_length)") != std::string::npos);
  r = run(xrun("-m " + q(*model) + " --prompt-ids 1,403,403,403,403 -n 4 -c 4"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("5 tokens, more than the context of 4 (-c)") != std::string::npos);
  json j = run_json("-m " + q(*model) + " --prompt-ids 1,403 -n 20 -c 10 --ignore-eos --json");
  CHECK(j["gen_ids"].size() == 8);
  CHECK(j["n_ctx"] == 10);

  write_text(tmp / "once.txt", "Once");
  const json f = run_json("-m " + q(*model) + " -f " + q(tmp / "once.txt") + " -n 20 --json");
  const json p = run_json("-m " + q(*model) + " -p Once -n 20 --json");
  CHECK(f["prompt_ids"] == p["prompt_ids"]);
  CHECK(f["gen_ids"] == p["gen_ids"]);
  r = run(xrun("-m " + q(*model) + " -f " + q(tmp / "absent.txt") + " -n 1"));
  CHECK(r.rc == 1);
  CHECK(r.err.find("absent.txt") != std::string::npos);

  r = run(xrun("-m " + q(*model) + " -p Once -n 10"));
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("load time =") != std::string::npos);
  CHECK(r.err.find("prompt eval time =") != std::string::npos);
  CHECK(r.err.find("/     2 tokens (") != std::string::npos);
  CHECK(r.err.find("eval time =") != std::string::npos);
  CHECK(r.err.find("ms per token") != std::string::npos);
  CHECK(r.err.find("tokens per second)") != std::string::npos);
}

TEST_CASE("-cnv: the format comes from the GGUF's tokenizer.chat_template") {
  NEED_STORIES();
  XPACK_REQUIRE_PYTHON_GGUF();
  xpack::test::TempDir tmp;
  write_text(tmp / "turns.txt", "Hi\n");
  struct Want {
    std::string file, format, prompt;
  };
  // The texts test_chat_template checks against jinja2, for one user turn, thinking
  // off, no BOS text (stories260K's tokenizer adds BOS itself).
  const std::vector<Want> wants = {
      {"deepseek-v4.jinja", "deepseek-v4", "<｜User｜>Hi<｜Assistant｜></think>"},
      {"kimi-k3.jinja", "kimi-k3",
       "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
       "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"},
      {"chatml.jinja", "chatml", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
  };
  for (const Want& w : wants) {
    CAPTURE(w.file);
    const fs::path m = tmp / (w.format + ".gguf");
    std::string out;
    REQUIRE_MESSAGE(xpack::test::run_command("python3 -m gguf.scripts.gguf_new_metadata " + q(*model) + " " + q(m) +
                                                 " --chat-template-file " +
                                                 q(xpack::test::data_dir() / "chat_templates" / w.file),
                                             &out) == 0,
                    out);
    RunResult r = run(xrun("-m " + q(m) + " -cnv -n 8 --json < " + q(tmp / "turns.txt")));
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json chat = json::parse(r.out);
    CHECK(chat["chat_format"] == w.format);
    CHECK(r.err.find("not a format xpack-run renders") == std::string::npos);
    write_text(tmp / "p.txt", w.prompt);
    const json one = run_json("-m " + q(m) + " -f " + q(tmp / "p.txt") + " -n 8 --json");
    CHECK(one["prompt_ids"].size() == chat["turns"][0]["prompt_tokens"]);
    CHECK(one["gen_ids"] == chat["turns"][0]["gen_ids"]);
  }
  // A template of a format not rendered natively (Kimi-K2's markers): the plain
  // fallback, said on stderr.
  const fs::path k2 = tmp / "k2.gguf";
  std::string out;
  REQUIRE(xpack::test::run_command("python3 -m gguf.scripts.gguf_new_metadata " + q(*model) + " " + q(k2) +
                                       " --chat-template " + q("<|im_user|>user<|im_middle|>{{ m }}<|im_end|>"),
                                   &out) == 0);
  RunResult r = run(xrun("-m " + q(k2) + " -cnv -n 4 --json < " + q(tmp / "turns.txt")));
  REQUIRE(r.rc == 0);
  CHECK(json::parse(r.out)["chat_format"] == "plain");
  CHECK(r.err.find("tokenizer.chat_template is not a format xpack-run renders") != std::string::npos);
  // --chat-format overrides what the template says.
  r = run(xrun("-m " + q(k2) + " -cnv -n 4 --json --chat-format chatml < " + q(tmp / "turns.txt")));
  REQUIRE(r.rc == 0);
  CHECK(json::parse(r.out)["chat_format"] == "chatml");
  CHECK(r.err.find("chat format chatml (--chat-format)") != std::string::npos);
  CHECK(r.err.find("not a format xpack-run renders") == std::string::npos);
}
