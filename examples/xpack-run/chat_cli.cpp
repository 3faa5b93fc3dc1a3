#include "chat_cli.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <istream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "sampling.h"
#include "stop_strings.h"
#include "timings.h"

namespace xrun {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string trim_space(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

}  // namespace

std::string chat_bos_text(const Weights& w, TextCodec& codec) {
  if (!codec.encode("").empty()) return {};
  const int64_t bos = w.get_int("tokenizer.ggml.bos_token_id", -1);
  if (bos < 0 || !w.has("tokenizer.ggml.tokens")) return {};
  const std::vector<std::string> tokens = w.get_string_array("tokenizer.ggml.tokens");
  return bos < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<size_t>(bos)] : std::string();
}

size_t reusable_prefix(const std::vector<int32_t>& evaluated, const std::vector<int32_t>& next) {
  if (evaluated.size() >= next.size()) return 0;  // nothing new to evaluate: start over
  for (size_t i = 0; i < evaluated.size(); ++i)
    if (evaluated[i] != next[i]) return 0;
  return evaluated.size();
}

int run_chat(const ChatRun& r, std::istream& in, std::FILE* out) {
  const CliOptions& o = r.options;
  const std::string tmpl = r.weights.has("tokenizer.chat_template") ? r.weights.get_string("tokenizer.chat_template") : "";
  const bool chosen = o.chat_format != "auto";
  const ChatFormat format = chosen ? chat_format_from_name(o.chat_format).value_or(ChatFormat::kPlain)
                                   : detect_chat_format(tmpl);
  if (!chosen && !tmpl.empty() && format == ChatFormat::kPlain)
    std::fprintf(stderr, "xpack-run: -cnv: tokenizer.chat_template is not a format xpack-run renders "
                         "(deepseek-v4, kimi-k3, chatml); using the plain fallback\n");
  std::fprintf(stderr, "xpack-run: -cnv: chat format %s%s\n", chat_format_name(format),
               chosen ? " (--chat-format)" : tmpl.empty() ? " (the model has no tokenizer.chat_template)" : "");
  ChatOptions copt;
  copt.thinking = false;  // replies are shown whole; a think channel would need parsing back
  copt.bos_token = chat_bos_text(r.weights, r.codec);

  SamplingParams sp = o.sampling;
  sp.seed = o.seed ? *o.seed : random_seed();
  if (!o.seed && sp.temperature > 0)
    std::fprintf(stderr, "xpack-run: seed %llu\n", static_cast<unsigned long long>(sp.seed));
  Sampler sampler(sp);
  std::vector<std::string> stop_list = o.stop;
  for (const std::string& s : chat_turn_stops(format)) stop_list.push_back(s);

  std::vector<ChatMessage> messages;
  if (!r.system.empty()) messages.push_back({"system", r.system, ""});
  const int n_vocab = r.model.n_vocab();
  std::vector<int32_t> evaluated;  // what the model's state holds, in order
  std::vector<float> row(static_cast<size_t>(n_vocab));
  const bool tty = isatty(STDIN_FILENO) && !o.json;
  nlohmann::ordered_json turns = nlohmann::ordered_json::array();
  double prefill_s = 0, decode_s = 0;
  size_t n_prefilled = 0, n_decoded = 0, n_reused = 0, n_resets = 0;
  std::string line;
  for (;;) {
    if (tty) {
      std::fputs("\n> ", out);
      std::fflush(out);
    }
    if (!std::getline(in, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    messages.push_back({"user", line, ""});
    std::vector<int32_t> next;
    try {
      next = r.codec.encode(render_chat(format, messages, copt));
    } catch (const std::invalid_argument& e) {
      throw ModelError(std::string("-cnv: ") + e.what());
    }
    if (r.n_ctx > 0 && static_cast<int64_t>(next.size()) >= r.n_ctx) {
      std::fprintf(stderr, "xpack-run: -cnv: the conversation has %zu tokens, the context holds %lld: chat ended\n",
                   next.size(), static_cast<long long>(r.n_ctx));
      break;
    }
    const size_t keep = reusable_prefix(evaluated, next);
    if (keep == 0 && !evaluated.empty()) {
      r.model.reset();
      sampler.clear_history();
      ++n_resets;
    }
    evaluated.resize(keep);
    n_reused += keep;
    for (size_t i = keep; i < next.size(); ++i) sampler.accept(next[i]);
    const int n_new = static_cast<int>(next.size() - keep);
    std::vector<float> logits(n_vocab);
    auto t0 = std::chrono::steady_clock::now();
    r.model.eval(next.data() + keep, n_new, static_cast<int>(keep), logits.data(), LogitRows::last);
    prefill_s += seconds_since(t0);
    n_prefilled += static_cast<size_t>(n_new);
    evaluated = next;
    std::copy(logits.end() - n_vocab, logits.end(), row.begin());

    StopScanner stops(stop_list);
    std::string reply;
    std::vector<int32_t> gen;
    std::string finish = "length";
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.n_predict; ++i) {
      if (r.n_ctx > 0 && static_cast<int64_t>(evaluated.size()) >= r.n_ctx) break;
      const int32_t tok = sampler.sample(row.data(), n_vocab);
      gen.push_back(tok);
      sampler.accept(tok);
      const std::string piece = stops.feed(r.codec.piece(tok));
      reply += piece;
      if (!o.json) {
        std::fwrite(piece.data(), 1, piece.size(), out);
        std::fflush(out);
      }
      if (stops.stopped()) {
        finish = "stop";
        break;
      }
      if (tok == r.eos) {
        finish = "eos";
        break;
      }
      r.model.eval(&tok, 1, static_cast<int>(evaluated.size()), row.data(), LogitRows::last);
      evaluated.push_back(tok);
      ++n_decoded;
    }
    decode_s += seconds_since(t0);
    if (!stops.stopped()) {
      const std::string tail = stops.flush();
      reply += tail;
      if (!o.json) std::fwrite(tail.data(), 1, tail.size(), out);
    }
    if (!o.json) std::fputs("\n", out);
    std::fflush(out);
    // Kept without surrounding whitespace: templates write their own ("Assistant: "
    // before it in the plain format), so the next rendering repeats the reply's
    // tokens and the state evaluated so far can stay.
    messages.push_back({"assistant", trim_space(reply), ""});
    turns.push_back({{"user", line},
                     {"reply", reply},
                     {"gen_ids", gen},
                     {"finish_reason", finish},
                     {"prompt_tokens", next.size()},
                     {"reused_tokens", keep}});
  }
  std::fputs(speed_lines(r.load_s, prefill_s, n_prefilled, decode_s, n_decoded).c_str(), stderr);
  std::fprintf(stderr, "xpack-run: -cnv: %zu turns, %zu prompt tokens evaluated, %zu kept from earlier turns, %zu resets\n",
               turns.size(), n_prefilled, n_reused, n_resets);
  if (o.json) {
    nlohmann::ordered_json j;
    j["chat_format"] = chat_format_name(format);
    j["seed"] = sp.seed;
    j["turns"] = turns;
    j["prompt_tokens_evaluated"] = n_prefilled;
    j["reused_tokens"] = n_reused;
    j["resets"] = n_resets;
    j["prefill_s"] = prefill_s;
    j["decode_s"] = decode_s;
    const std::string js = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    std::fprintf(out, "%s\n", js.c_str());
  }
  return 0;
}

}  // namespace xrun
