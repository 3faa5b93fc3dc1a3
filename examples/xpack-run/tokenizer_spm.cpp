// SentencePiece BPE (model "llama"), as llama.cpp's llm_tokenizer_spm: the text
// starts as one symbol per UTF-8 character; the adjacent pair whose
// concatenation is a token with the highest score is merged (leftmost first on
// ties) until no concatenation is a token. Symbols that are not tokens fall
// back to <0xXX> byte tokens.
#include <queue>

#include "tokenizer.h"
#include "unicode_util.h"

namespace xrun {
namespace {

struct Symbol {
  int prev, next;
  size_t off, n;
};

struct Bigram {
  int left, right;
  float score;
  size_t size;
};

// Highest score first; among equal scores the leftmost pair.
struct LowerPriority {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(text.size() - off, unicode::utf8_sequence_length(uint8_t(text[off])));
    const int idx = int(sym.size());
    sym.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
    off += n;
  }
  if (sym.empty()) return;

  std::priority_queue<Bigram, std::vector<Bigram>, LowerPriority> queue;
  auto add_bigram = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    // Live neighbours are always adjacent in the text.
    const std::string_view joined = text.substr(sym[l].off, sym[l].n + sym[r].n);
    const int32_t id = find(joined);
    if (id < 0) return;
    const float score = vocab_.scores.empty() ? 0.0f : vocab_.scores[size_t(id)];
    queue.push({l, r, score, joined.size()});
  };
  for (int i = 1; i < int(sym.size()); ++i) add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& left = sym[bg.left];
    Symbol& right = sym[bg.right];
    // Stale entry: one side has merged with something else since it was queued.
    if (left.n == 0 || right.n == 0 || left.n + right.n != bg.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = bg.left;
    add_bigram(left.prev, bg.left);
    add_bigram(bg.left, left.next);
  }

  for (int i = 0; i != -1; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].off, sym[i].n);
    const int32_t id = find(piece);
    if (id >= 0) out.push_back(id);
    else push_byte_tokens(piece, out);
  }
}

void Tokenizer::push_byte_tokens(std::string_view bytes, std::vector<int32_t>& out) const {
  for (unsigned char b : bytes) {
    int32_t id = byte_tokens_[b];
    if (id < 0) id = find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (id < 0) id = vocab_.unk;
    if (id >= 0) out.push_back(id);
  }
}

}  // namespace xrun
