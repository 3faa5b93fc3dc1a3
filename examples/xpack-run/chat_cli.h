// -cnv: a chat on the terminal. Each line of stdin is a user turn; the whole
// conversation is rendered with the model's chat template (chat_template.h),
// and only the tokens after what the model has already evaluated are fed to it,
// so the KV/recurrent state is kept across turns. Where the new rendering does
// not start with the evaluated tokens (a reply that tokenizes differently when
// re-read), the model is reset and the conversation evaluated again.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "cli.h"
#include "model.h"
#include "text.h"
#include "weights.h"

namespace xrun {

struct ChatRun {
  Model& model;
  TextCodec& codec;
  const Weights& weights;
  const CliOptions& options;
  std::string system;  // -p / -f text: the system message (may be empty)
  int64_t n_ctx;       // 0 = unbounded
  int32_t eos;         // -1 = none
  double load_s;
};

// The text a template writes for BOS ({{ bos_token }}); empty where the
// tokenizer adds BOS itself (encoding "" gives it), so it is not doubled.
// -cnv and the server's chat share it.
std::string chat_bos_text(const Weights& w, TextCodec& codec);

// The evaluated tokens are a prefix of `next`: how many can be kept (0 = none;
// reset and evaluate everything).
size_t reusable_prefix(const std::vector<int32_t>& evaluated, const std::vector<int32_t>& next);

// Reads turns from `in` until EOF, writes replies to `out` (or, with --json, one
// JSON object at the end). Returns the exit status.
int run_chat(const ChatRun& run, std::istream& in, std::FILE* out);

}  // namespace xrun
