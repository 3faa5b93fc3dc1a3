// Pieces shared by the tokenizer's source files; not part of its interface.
#pragma once

#include <string>
#include <string_view>

namespace xrun::tokenizer_detail {

// GPT-2's byte-level alphabet: every byte as one printable codepoint, so BPE
// vocabularies never hold raw spaces or control bytes ("Ġ" = ' ', "Ċ" = '\n').
std::string byte_level_encode(std::string_view bytes);
// The inverse; codepoints outside the alphabet are kept as their UTF-8.
std::string byte_level_decode(std::string_view text);

// SentencePiece's visible space, U+2581.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

}  // namespace xrun::tokenizer_detail
