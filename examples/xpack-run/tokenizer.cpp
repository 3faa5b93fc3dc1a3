// Tokenizer construction, special-token partitioning, encode dispatch and
// decoding. The merge loops live in tokenizer_spm.cpp / tokenizer_bpe.cpp, the
// pre-tokenizers in tokenizer_pretok.cpp, metadata reading in tokenizer_gguf.cpp.
#include "tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "tokenizer_detail.h"
#include "weights.h"

namespace xrun {

using tokenizer_detail::kSpmSpace;

namespace {

PreTokenizer pre_tokenizer_named(const std::string& name) {
  if (name == "gpt-2" || name == "gpt2") return PreTokenizer::gpt2;
  if (name == "default") return PreTokenizer::bpe_default;
  if (name == "deepseek-llm") return PreTokenizer::deepseek_llm;
  throw ModelError("tokenizer.ggml.pre: unsupported pre-tokenizer '" + name +
                   "' (supported: gpt-2, default, deepseek-llm)");
}

void check_id(const char* what, int32_t id, size_t n) {
  if (id < -1 || (id >= 0 && size_t(id) >= n))
    throw ModelError(std::string("tokenizer.ggml.") + what + " " + std::to_string(id) +
                     " is not a token id (vocabulary of " + std::to_string(n) + ")");
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace

Tokenizer::Tokenizer(VocabData vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.tokens.size();
  if (vocab_.model == "llama") {
    spm_ = true;
  } else if (vocab_.model == "gpt2") {
    pre_ = pre_tokenizer_named(vocab_.pre);
  } else {
    throw ModelError("tokenizer.ggml.model: unsupported tokenizer '" + vocab_.model +
                     "' (supported: llama, gpt2)");
  }
  if (n == 0) throw ModelError("tokenizer.ggml.tokens: empty vocabulary");
  if (n > size_t(INT32_MAX)) throw ModelError("tokenizer.ggml.tokens: vocabulary too large");
  if (!vocab_.scores.empty() && vocab_.scores.size() != n)
    throw ModelError("tokenizer.ggml.scores has " + std::to_string(vocab_.scores.size()) +
                     " entries for " + std::to_string(n) + " tokens");
  if (!vocab_.types.empty() && vocab_.types.size() != n)
    throw ModelError("tokenizer.ggml.token_type has " + std::to_string(vocab_.types.size()) +
                     " entries for " + std::to_string(n) + " tokens");
  check_id("bos_token_id", vocab_.bos, n);
  check_id("eos_token_id", vocab_.eos, n);
  check_id("unknown_token_id", vocab_.unk, n);

  token_ids_.reserve(n);
  // Duplicate texts: the later id wins, as in llama.cpp's token_to_id map.
  for (size_t i = 0; i < n; ++i) token_ids_[vocab_.tokens[i]] = int32_t(i);

  if (!spm_) {
    if (vocab_.merges.empty()) throw ModelError("tokenizer.ggml.merges: missing or empty (gpt2 model)");
    merge_ranks_.reserve(vocab_.merges.size());
    for (size_t r = 0; r < vocab_.merges.size(); ++r) {
      const std::string& m = vocab_.merges[r];
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      if (sp == std::string::npos || sp + 1 >= m.size())
        throw ModelError("tokenizer.ggml.merges[" + std::to_string(r) + "] '" + m +
                         "' is not 'left right'");
      std::string key = m.substr(0, sp);
      key.push_back('\0');
      key.append(m, sp + 1);
      merge_ranks_.emplace(std::move(key), int(r));  // first listing wins
    }
  }

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_tokens_[b] = spm_ ? find(name) : -1;
  }

  // Tokens matched verbatim in the input, longest first so "<|a|>x" is not cut
  // by a shorter "<|a".
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = token_type(int32_t(i));
    if ((t == TokenType::control || t == TokenType::user_defined || t == TokenType::unknown) &&
        !vocab_.tokens[i].empty())
      special_by_length_.push_back(int32_t(i));
  }
  std::stable_sort(special_by_length_.begin(), special_by_length_.end(), [&](int32_t a, int32_t b) {
    return vocab_.tokens[size_t(a)].size() > vocab_.tokens[size_t(b)].size();
  });
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary of " +
                            std::to_string(n_vocab()));
  return vocab_.tokens[size_t(id)];
}

TokenType Tokenizer::token_type(int32_t id) const {
  token_text(id);  // range check
  if (vocab_.types.empty()) return TokenType::normal;
  const int32_t t = vocab_.types[size_t(id)];
  return t >= 0 && t <= 6 ? TokenType(t) : TokenType::undefined;
}

int32_t Tokenizer::find(std::string_view text) const {
  auto it = token_ids_.find(std::string(text));
  return it == token_ids_.end() ? -1 : it->second;
}

std::vector<Tokenizer::Fragment> Tokenizer::partition_special(std::string_view text,
                                                              bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({text, -1});
  for (int32_t id : special_by_length_) {
    const TokenType t = token_type(id);
    if (!parse_special && t != TokenType::user_defined) continue;
    const std::string& needle = vocab_.tokens[size_t(id)];
    std::vector<Fragment> next;
    next.reserve(frags.size());
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t hit; (hit = rest.find(needle)) != std::string_view::npos;) {
        if (hit > 0) next.push_back({rest.substr(0, hit), -1});
        next.push_back({{}, id});
        rest.remove_prefix(hit + needle.size());
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    frags = std::move(next);
  }
  return frags;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
  // SentencePiece puts a space before the text and after each special token.
  bool after_special = true;
  for (const Fragment& f : partition_special(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    if (spm_) {
      std::string s = vocab_.add_space_prefix && after_special ? " " : "";
      s.append(f.text);
      encode_spm(replace_all(s, " ", kSpmSpace), out);
    } else {
      for (const std::string& word : pretokenize(pre_, f.text))
        encode_bpe_word(tokenizer_detail::byte_level_encode(word), out);
    }
    after_special = false;
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  const std::string& text = token_text(id);
  switch (token_type(id)) {
    case TokenType::control:
    case TokenType::unknown:
      return special ? text : std::string();
    case TokenType::user_defined:
      return text;
    case TokenType::normal:
      return spm_ ? replace_all(text, kSpmSpace, " ") : tokenizer_detail::byte_level_decode(text);
    case TokenType::byte:
      if (spm_ && text.size() == 6 && text.rfind("<0x", 0) == 0 && text[5] == '>') {
        unsigned v = 0;
        if (std::sscanf(text.c_str() + 3, "%2x", &v) == 1) return std::string(1, char(v));
      }
      return std::string();
    case TokenType::undefined:
    case TokenType::unused:
      break;
  }
  return std::string();
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, special);
  return out;
}

}  // namespace xrun
