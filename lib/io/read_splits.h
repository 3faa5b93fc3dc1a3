// Cutting one object read into K aligned ranges (read_splits), so one object can
// keep several NVMe queues busy. Every range start and length is a multiple of
// 4096; when the read has fewer pages than K, fewer ranges are returned.
#pragma once
#include <cstdint>
#include <vector>

namespace xpack::io {

struct ReadRange {
  uint64_t offset;  // relative to the start of the object read
  uint64_t length;
};

// Ranges covering [0, length) (length a multiple of 4096, splits >= 1). Range p
// starts at floor(pages * p / k) pages, like the seed's _object_read_ranges but
// over the aligned read length so that the last range is aligned too. Ranges
// are further cut so that none crosses a multiple of `boundary` (0 = no limit):
// a registered buffer (iovec) holds at most 1 GiB and one read must stay inside
// one iovec.
std::vector<ReadRange> split_read(uint64_t length, uint32_t splits, uint64_t boundary = 0);

}  // namespace xpack::io
