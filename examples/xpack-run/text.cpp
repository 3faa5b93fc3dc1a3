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

std::unique_ptr<TextCodec> make_text_codec(const Weights& w) {
  if (!w.has("tokenizer.ggml.model")) return nullptr;
  return std::make_unique<GgufTextCodec>(Tokenizer::from_gguf(w.gguf()));
}

}  // namespace xrun
