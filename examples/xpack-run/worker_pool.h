// Parallel loops over a persistent worker pool (--threads). Work is split by
// output rows, each element written by one thread, so results never depend on
// the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace xrun {

void set_threads(int n);
int threads();

// Runs fn over [0, n) in chunks on threads() workers (inline inside a worker).
void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

// parallel_for, but run inline when the whole job is too small to pay for
// waking the workers (work = rough count of multiply-adds per item).
void parallel_for_work(int64_t n, int64_t work_per_item,
                       const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace xrun
