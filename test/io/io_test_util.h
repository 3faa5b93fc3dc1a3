// Test files with known content for the I/O engine suites: every 8-byte word of
// the file is a hash of its offset, so any misplaced or stale byte is visible.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fixtures.h"

namespace xpack::test {

inline uint64_t pattern_word(uint64_t word_index, uint64_t seed) {
  uint64_t z = word_index * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::vector<uint8_t> pattern_bytes(uint64_t size, uint64_t seed) {
  std::vector<uint8_t> out(size);
  for (uint64_t w = 0; w * 8 < size; ++w) {
    uint64_t v = pattern_word(w, seed);
    std::memcpy(out.data() + w * 8, &v, std::min<uint64_t>(8, size - w * 8));
  }
  return out;
}

inline std::filesystem::path make_pattern_file(const TempDir& dir, const std::string& name,
                                               uint64_t size, uint64_t seed = 1) {
  auto p = dir / name;
  write_file(p, pattern_bytes(size, seed));
  return p;
}

// True when [p, p+len) equals the pattern file's bytes at `offset`.
inline bool matches_pattern(const uint8_t* p, uint64_t offset, uint64_t len, uint64_t seed = 1) {
  for (uint64_t i = 0; i < len; i += 8) {
    uint64_t v = pattern_word((offset + i) / 8, seed);
    if (std::memcmp(p + i, &v, std::min<uint64_t>(8, len - i)) != 0) return false;
  }
  return true;
}

}  // namespace xpack::test
