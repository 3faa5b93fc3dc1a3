// Text in and out of xpack-run: a thin adapter over the GGUF tokenizer so
// main() does not depend on how the tokenizer is built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weights.h"

namespace xrun {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Prompt text -> ids, with BOS when the model's metadata asks for it.
  virtual std::vector<int32_t> encode(const std::string& text) = 0;
  // The bytes one generated token contributes to the output text.
  virtual std::string piece(int32_t id) = 0;
};

// Nullptr when the model has no tokenizer metadata.
std::unique_ptr<TextCodec> make_text_codec(const Weights& w);

}  // namespace xrun
