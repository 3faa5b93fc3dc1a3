// Pre-tokenizers for byte-level BPE: the regex splits of the Hugging Face
// tokenizers, implemented as hand-written matchers over codepoints with the
// semantics llama.cpp gives them (a list of regexes applied one after another,
// each splitting every piece from the previous pass into matches and the gaps
// between them; ECMAScript leftmost matching, greedy quantifiers).
#include <functional>

#include "tokenizer.h"
#include "unicode_util.h"

namespace xrun {
namespace {

using unicode::CodepointRange;
using unicode::in_ranges;
using unicode::is_letter;
using unicode::is_number;
using unicode::is_punctuation;
using unicode::is_whitespace;

using Cps = std::vector<uint32_t>;
// Length of the match starting exactly at pos (0 = none), searching [pos, end).
using Matcher = std::function<size_t(const Cps&, size_t pos, size_t end)>;

// One regex pass: splits each piece [start, start+len) into matches and gaps.
std::vector<size_t> split_pass(const Cps& cps, const std::vector<size_t>& pieces,
                               const Matcher& match) {
  std::vector<size_t> out;
  out.reserve(pieces.size() * 2);
  size_t start = 0;
  for (size_t len : pieces) {
    const size_t end = start + len;
    size_t gap_from = start;
    size_t pos = start;
    while (pos < end) {
      const size_t m = match(cps, pos, end);
      if (m == 0) {
        ++pos;
        continue;
      }
      if (pos > gap_from) out.push_back(pos - gap_from);
      out.push_back(m);
      pos += m;
      gap_from = pos;
    }
    if (end > gap_from) out.push_back(end - gap_from);
    start = end;
  }
  return out;
}

// The GPT-2 pattern:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Cps& c, size_t pos, size_t end) {
  const uint32_t c0 = c[pos];
  if (c0 == '\'' && pos + 1 < end) {
    const uint32_t c1 = c[pos + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 < end) {
      const uint32_t c2 = c[pos + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return 3;
    }
  }
  const size_t k = pos + (c0 == ' ' ? 1 : 0);
  if (k < end) {
    auto run = [&](auto pred) {
      size_t j = k;
      while (j < end && pred(c[j])) ++j;
      return j - pos;
    };
    const uint32_t ck = c[k];
    if (is_letter(ck)) return run(is_letter);
    if (is_number(ck)) return run(is_number);
    auto is_other = [](uint32_t x) { return !is_whitespace(x) && !is_letter(x) && !is_number(x); };
    if (is_other(ck)) return run(is_other);
  }
  // Only whitespace is left here (a lone ' ' before whitespace, or other space).
  size_t j = pos;
  while (j < end && is_whitespace(c[j])) ++j;
  size_t n = j - pos;
  // \s+(?!\S): leave the last space to the word that follows it.
  if (j < end && n > 1) --n;
  return n;
}

// \s as std::wregex sees it after llama.cpp maps non-ASCII whitespace to 0x0B.
bool regex_space(uint32_t cp) { return is_whitespace(cp); }

// \s?[class]+ where the class never matches whitespace.
size_t match_opt_space_run(const Cps& c, size_t pos, size_t end, bool (*in_class)(uint32_t)) {
  size_t k = pos;
  if (regex_space(c[k]) && k + 1 < end && in_class(c[k + 1])) ++k;
  if (!in_class(c[k])) return 0;
  size_t j = k;
  while (j < end && in_class(c[j])) ++j;
  return j - pos;
}

size_t match_run(const Cps& c, size_t pos, size_t end, bool (*in_class)(uint32_t)) {
  size_t j = pos;
  while (j < end && in_class(c[j])) ++j;
  return j - pos;
}

// --- deepseek-llm -----------------------------------------------------------
// The character classes of DeepSeek LLM's tokenizer.json regexes, as codepoint
// ranges.

constexpr CodepointRange kDeepseekLetters[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// [!-/:-~！-／：-～‘-‟　-。] (sorted)
constexpr CodepointRange kDeepseekPunct[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};
// [一-龥ࠀ-一가-퟿] (sorted, merged)
constexpr CodepointRange kDeepseekCjk[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

template <size_t N>
bool in(const CodepointRange (&r)[N], uint32_t cp) {
  return in_ranges(r, N, cp);
}

// Whitespace was replaced by 0x0B before the class test, so it never matches.
bool ds_letter(uint32_t cp) { return !is_whitespace(cp) && in(kDeepseekLetters, cp); }
bool ds_punct(uint32_t cp) { return !is_whitespace(cp) && in(kDeepseekPunct, cp); }
bool ds_cjk(uint32_t cp) { return !is_whitespace(cp) && in(kDeepseekCjk, cp); }

// \p{N} as llama.cpp evaluates it: ASCII digits, or a non-ASCII, non-space number.
bool collapsed_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return !is_whitespace(cp) && is_number(cp);
}

// [\p{P}\$\+<=>\^~\|] the same way: ASCII punctuation but '`', or a non-ASCII,
// non-space punctuation character.
bool collapsed_punct_or_symbol(uint32_t cp) {
  if (cp < 0x80) return cp > 0x20 && cp < 0x7F && cp != '`' && !(cp >= '0' && cp <= '9') &&
                        !(cp >= 'A' && cp <= 'Z') && !(cp >= 'a' && cp <= 'z');
  return !is_whitespace(cp) && is_punctuation(cp);
}

bool ascii_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

std::vector<Matcher> passes_for(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::gpt2:
      return {match_gpt2};
    case PreTokenizer::bpe_default:
      return {
          [](const Cps& c, size_t p, size_t e) { return match_run(c, p, e, collapsed_punct_or_symbol); },
          // The GPT-2 pattern without its final \s+; a lone space it leaves
          // unmatched becomes a gap piece of its own, which is the same split.
          match_gpt2,
          [](const Cps& c, size_t p, size_t e) { return match_run(c, p, e, collapsed_number); },
          [](const Cps& c, size_t p, size_t e) -> size_t {
            return p + 3 <= e && ascii_digit(c[p]) && ascii_digit(c[p + 1]) && ascii_digit(c[p + 2])
                       ? 3 : 0;
          },
      };
    case PreTokenizer::deepseek_llm:
      return {
          // [\r\n]
          [](const Cps& c, size_t p, size_t) -> size_t { return c[p] == '\r' || c[p] == '\n'; },
          [](const Cps& c, size_t p, size_t e) { return match_opt_space_run(c, p, e, ds_letter); },
          [](const Cps& c, size_t p, size_t e) { return match_opt_space_run(c, p, e, ds_punct); },
          // \s+$ : whitespace from here to the end of the piece. The start of
          // the piece's trailing whitespace is found once per piece, so long
          // runs of spaces stay linear.
          [piece_end = size_t(-1), trail = size_t(0)](const Cps& c, size_t p,
                                                      size_t e) mutable -> size_t {
            if (e != piece_end) {
              piece_end = e;
              trail = e;
              while (trail > 0 && regex_space(c[trail - 1])) --trail;
            }
            return p >= trail ? e - p : 0;
          },
          [](const Cps& c, size_t p, size_t e) { return match_run(c, p, e, ds_cjk); },
          [](const Cps& c, size_t p, size_t e) { return match_run(c, p, e, collapsed_number); },
      };
    case PreTokenizer::none:
      break;
  }
  return {};
}

}  // namespace

std::vector<std::string> pretokenize(PreTokenizer kind, std::string_view text) {
  const Cps cps = unicode::decode_utf8(text);
  if (cps.empty()) return {};
  std::vector<size_t> pieces = {cps.size()};
  for (const Matcher& m : passes_for(kind)) pieces = split_pass(cps, pieces, m);
  std::vector<std::string> words;
  words.reserve(pieces.size());
  size_t start = 0;
  for (size_t len : pieces) {
    std::string w;
    for (size_t i = start; i < start + len; ++i) unicode::append_utf8(w, cps[i]);
    words.push_back(std::move(w));
    start += len;
  }
  return words;
}

}  // namespace xrun
