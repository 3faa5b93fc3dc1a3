#include "io/read_splits.h"

#include <algorithm>

#include "io/alignment.h"

namespace xpack::io {

std::vector<ReadRange> split_read(uint64_t length, uint32_t splits, uint64_t boundary) {
  std::vector<ReadRange> out;
  if (length == 0 || splits == 0) return out;
  const uint64_t pages = length / kDirectIoAlign;
  const uint64_t k = std::max<uint64_t>(1, std::min<uint64_t>(splits, pages));
  for (uint64_t p = 0; p < k; ++p) {
    // 128-bit product: pages * p can exceed 64 bits only for absurd inputs, but
    // the caller may pass hostile lengths.
    uint64_t b0 = static_cast<uint64_t>((static_cast<unsigned __int128>(pages) * p) / k) *
                  kDirectIoAlign;
    uint64_t b1 = p + 1 == k ? length
                             : static_cast<uint64_t>(
                                   (static_cast<unsigned __int128>(pages) * (p + 1)) / k) *
                                   kDirectIoAlign;
    while (b0 < b1) {
      uint64_t end = b1;
      if (boundary != 0) end = std::min(end, (b0 / boundary + 1) * boundary);
      out.push_back({b0, end - b0});
      b0 = end;
    }
  }
  return out;
}

}  // namespace xpack::io
