// The one alignment rule of the read path: O_DIRECT reads need offset, length and
// buffer address on 4096-byte boundaries (the largest logical block size in use
// on NVMe, and the page size). Checked at open and submit, never silently fixed.
#pragma once
#include <cstdint>

namespace xpack::io {

inline constexpr uint64_t kDirectIoAlign = 4096;

inline constexpr bool io_aligned(uint64_t x) { return x % kDirectIoAlign == 0; }
inline bool io_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kDirectIoAlign == 0;
}

}  // namespace xpack::io
