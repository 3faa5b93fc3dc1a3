// RoPE / YaRN of deepseek4: the shared implementation (rope_yarn.h), named as
// the closed-form test (test_deepseek4_rope) calls it.
#include "rope.h"

namespace xrun::ds4 {

void rope_cache(const RopeParams& p, int64_t pos, bool inverse, float* cache) { rope_yarn_cache(p, pos, inverse, cache); }

void rope_apply(const float* cache, int n_dims, float* x) { rope_yarn_apply(cache, n_dims, x); }

}  // namespace xrun::ds4
