#include "text.h"

#include "tokenizer.h"

namespace xrun {

namespace {

class GgufTextCodec final : public TextCodec {
 public:
  explicit GgufTextCodec(std::unique_ptr<Tokenizer> t) : tok_(std::move(t)) {}
  // Special-token text in the prompt is parsed as llama.cpp's examples do.
  std::vector<int32_t> encode(const std::string& text) override {
    return tok_->encode(text, tok_->add_bos_default(), /*parse_special=*/true);
  }
  std::string piece(int32_t id) override {
    if (id < 0 || id >= tok_->n_vocab()) return {};
    return tok_->token_to_piece(id);
  }

 private:
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace

std::string to_valid_utf8(std::string_view bytes) {
  static constexpr const char* kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out += static_cast<char>(lead);
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (Unicode table 3-7):
    // the narrow ranges exclude overlongs, surrogates and values past U+10FFFF.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      len = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      len = 3;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      len = 4;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < n && j - i < len) {
      const auto c = static_cast<unsigned char>(bytes[j]);
      const bool ok = (j == i + 1) ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++j;
    }
    if (j - i == len) {
      out.append(bytes.data() + i, len);
    } else {
      out += kReplacement;
    }
    i = j;
  }
  return out;
}

std::unique_ptr<TextCodec> make_text_codec(const Weights& w) {
  if (!w.has("tokenizer.ggml.model")) return nullptr;
  return std::make_unique<GgufTextCodec>(Tokenizer::from_gguf(w.gguf()));
}

}  // namespace xrun
