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

// `bytes` with every ill-formed UTF-8 subsequence replaced by U+FFFD (one per
// maximal subpart, as Unicode ch. 3 recommends); well-formed text is returned
// unchanged. Generated text can end mid-character or be raw byte tokens, and
// JSON consumers reject strings that are not UTF-8.
std::string to_valid_utf8(std::string_view bytes);

// Nullptr when the model has no tokenizer metadata.
std::unique_ptr<TextCodec> make_text_codec(const Weights& w);

}  // namespace xrun
