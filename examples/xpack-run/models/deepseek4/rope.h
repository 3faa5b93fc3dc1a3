// Rotary position embedding as ggml computes it for the "normal" layout (each
// rotated pair is two adjacent values), including the YaRN ramp. DeepSeek-V4
// rotates only the last n_dims values of a head and un-rotates the attention
// output with the inverse rotation at the query position.
#pragma once

#include <cstdint>
#include <vector>

#include "hparams.h"

namespace xrun::ds4 {

// cos/sin of every pair for one position: cache[2i] = cos, cache[2i+1] = sin
// (sin negated when `inverse`).
void rope_cache(const RopeParams& p, int64_t pos, bool inverse, float* cache);

// Rotates x[0 .. p.n_dims) in place with a cache from rope_cache.
void rope_apply(const float* cache, int n_dims, float* x);

}  // namespace xrun::ds4
