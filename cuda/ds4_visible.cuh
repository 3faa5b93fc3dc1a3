// The compressed blocks a query at position `pos` sees: the indexer and the
// attention core agree on it (ds4_kernels.cu, ds4_indexer.cu).
#pragma once

#include <cstdint>

namespace xpack::rt::ds4 {

__device__ inline int64_t visible_blocks(int64_t pos, int64_t ratio, int64_t n_blocks) {
  return min((pos + 1) / ratio, n_blocks);
}

}  // namespace xpack::rt::ds4
