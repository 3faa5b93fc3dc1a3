// Text <-> token ids from a GGUF's tokenizer.ggml.* metadata, behaving like
// llama.cpp's tokenizer so prompts give the ids llama.cpp would give:
//  - model "llama": SentencePiece BPE by token score (llm_tokenizer_spm), with the
//    "▁" space escape, optional leading-space prefix and <0xXX> byte fallback;
//  - model "gpt2": byte-level BPE by merge rank, after the pre-tokenizer named by
//    tokenizer.ggml.pre ("gpt-2", "default", "deepseek-llm").
// User-defined tokens are always matched verbatim in the input; control tokens
// (<s>, <|endoftext|> ...) only when encode() is asked to parse special tokens.
// A Tokenizer is immutable after construction: every method may be called from
// any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

struct xpack_gguf;

namespace xrun {

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

// Everything the tokenizer reads from the metadata. Ids are -1 when absent.
struct VocabData {
  std::string model;            // tokenizer.ggml.model
  std::string pre = "default";  // tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<float> scores;    // empty = all 0
  std::vector<int32_t> types;   // empty = all normal
  std::vector<std::string> merges;  // "left right", rank = index
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = true;  // SentencePiece only
};

// Reads tokenizer.ggml.* through libxpack's public C API. Throws ModelError
// naming the missing or malformed key. Applies llama.cpp's defaults for absent
// optional keys (SentencePiece: bos 1, eos 2, unk 0, add_bos true).
VocabData read_vocab(xpack_gguf* g);

enum class PreTokenizer { none, gpt2, bpe_default, deepseek_llm };

// Splits text into the words byte-level BPE merges within (UTF-8, not yet
// byte-encoded). Exposed for tests.
std::vector<std::string> pretokenize(PreTokenizer kind, std::string_view text);

class Tokenizer {
 public:
  // Throws ModelError for an unsupported model or pre-tokenizer, or metadata
  // that does not fit together (array lengths, ids out of range, bad merges).
  explicit Tokenizer(VocabData vocab);
  static std::unique_ptr<Tokenizer> from_gguf(xpack_gguf* g);

  // Text -> ids; BOS first when add_bos (and the vocabulary has one). Never
  // throws on odd input: invalid UTF-8 is tokenized (as U+FFFD or byte tokens).
  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special = false) const;
  // Concatenated pieces; control tokens contribute nothing unless `special`.
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;
  // The bytes one token stands for: "▁" -> " ", <0x0A> -> "\n", byte-level
  // characters -> their bytes. Throws std::out_of_range for an id not in the vocab.
  std::string token_to_piece(int32_t id, bool special = false) const;

  int32_t n_vocab() const { return int32_t(vocab_.tokens.size()); }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  bool add_bos_default() const { return vocab_.add_bos; }
  bool is_spm() const { return spm_; }
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Id of an exact token text, or -1.
  int32_t find(std::string_view text) const;

 private:
  struct Fragment {
    std::string_view text;  // raw text when token < 0
    int32_t token = -1;
  };
  std::vector<Fragment> partition_special(std::string_view text, bool parse_special) const;
  void encode_spm(std::string_view text, std::vector<int32_t>& out) const;
  void encode_bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void push_byte_tokens(std::string_view bytes, std::vector<int32_t>& out) const;
  int bpe_rank(std::string_view left, std::string_view right) const;

  VocabData vocab_;
  bool spm_ = false;
  PreTokenizer pre_ = PreTokenizer::none;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::unordered_map<std::string, int> merge_ranks_;  // key: left '\0' right
  std::vector<int32_t> special_by_length_;            // longest text first
  int32_t byte_tokens_[256];                          // SentencePiece <0xXX>, or -1
};

}  // namespace xrun
