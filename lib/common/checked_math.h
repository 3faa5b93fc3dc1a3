// Overflow-checked size arithmetic for sizes read from untrusted files.
#pragma once
#include <cstdint>
#include <optional>

namespace xpack {

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
inline constexpr bool is_aligned(uint64_t x, uint64_t a) { return x % a == 0; }

// Formats a byte count for humans: "1.50 GiB".
const char* human_bytes(uint64_t n, char* buf, unsigned buf_size);

}  // namespace xpack
