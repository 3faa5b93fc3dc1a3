// Byte-level BPE (model "gpt2"): each pre-tokenized word, byte-encoded, starts
// as one symbol per character; the adjacent pair with the lowest merge rank is
// merged (leftmost first on ties) until no listed merge applies, as
// llama.cpp's llm_tokenizer_bpe does.
#include <array>
#include <queue>

#include "tokenizer.h"
#include "tokenizer_detail.h"
#include "unicode_util.h"

namespace xrun {
namespace tokenizer_detail {
namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : next++;
      to_byte[to_cp[b]] = uint8_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) unicode::append_utf8(out, alphabet().to_cp[b]);
  return out;
}

std::string byte_level_decode(std::string_view text) {
  std::string out;
  for (uint32_t cp : unicode::decode_utf8(text)) {
    auto it = alphabet().to_byte.find(cp);
    if (it != alphabet().to_byte.end()) out += char(it->second);
    else unicode::append_utf8(out, cp);
  }
  return out;
}

}  // namespace tokenizer_detail

namespace {

struct Symbol {
  int prev, next;
  size_t off, n;
};

struct Bigram {
  int left, right;
  int rank;
  std::string text;
};

// Lowest rank first; among equal ranks the leftmost pair.
struct LaterBigram {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

int Tokenizer::bpe_rank(std::string_view left, std::string_view right) const {
  std::string key;
  key.reserve(left.size() + right.size() + 1);
  key.append(left).push_back('\0');
  key.append(right);
  auto it = merge_ranks_.find(key);
  return it == merge_ranks_.end() ? -1 : it->second;
}

void Tokenizer::encode_bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t off = 0; off < word.size();) {
    const size_t n = std::min(word.size() - off, unicode::utf8_sequence_length(uint8_t(word[off])));
    const int idx = int(sym.size());
    sym.push_back({idx - 1, off + n == word.size() ? -1 : idx + 1, off, n});
    off += n;
  }
  if (sym.empty()) return;
  auto text_of = [&](const Symbol& s) { return std::string_view(word).substr(s.off, s.n); };

  std::priority_queue<Bigram, std::vector<Bigram>, LaterBigram> queue;
  auto add_bigram = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const int rank = bpe_rank(text_of(sym[l]), text_of(sym[r]));
    if (rank < 0) return;
    std::string t(text_of(sym[l]));
    t.append(text_of(sym[r]));
    queue.push({l, r, rank, std::move(t)});
  };
  for (int i = 1; i < int(sym.size()); ++i) add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& left = sym[bg.left];
    Symbol& right = sym[bg.right];
    if (left.n == 0 || right.n == 0) continue;
    // Stale entry: one side has merged with something else since it was queued.
    if (left.n + right.n != bg.text.size() || word.compare(left.off, bg.text.size(), bg.text) != 0)
      continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = bg.left;
    add_bigram(left.prev, bg.left);
    add_bigram(bg.left, left.next);
  }

  for (int i = 0; i != -1; i = sym[i].next) {
    const std::string_view piece = text_of(sym[i]);
    const int32_t id = find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Not in the vocabulary (a merge result without a token): its single
    // bytes, where those are tokens, as llama.cpp does.
    for (char c : piece) {
      const int32_t b = find(std::string_view(&c, 1));
      if (b >= 0) out.push_back(b);
    }
  }
}

}  // namespace xrun
