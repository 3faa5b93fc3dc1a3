#include "worker_pool.h"

#include <algorithm>

namespace xrun {

namespace {

// Set on every thread while it runs a chunk of a parallel loop: a loop
// started from there runs inline instead of waiting on busy workers.
thread_local bool t_in_parallel = false;

}  // namespace

int default_threads() {
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(std::min(hc, 64u));
}

WorkerPool::WorkerPool(int n_threads) {
  const int n = n_threads > 0 ? n_threads : default_threads();
  for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::parallel_for(int64_t n, int64_t work_per_item, const RangeFn& fn) {
  constexpr int64_t kInlineWork = 1 << 16;
  if (n <= 0) return;
  if (t_in_parallel || size() == 1 || n == 1 || (work_per_item > 0 && n <= kInlineWork / work_per_item)) {
    fn(0, n);
    return;
  }
  // About four chunks per worker balances uneven items without much overhead.
  const int64_t chunk = std::max<int64_t>(1, n / (int64_t(size()) * 4));
  auto guarded = [&](int64_t b, int64_t e) {
    const bool was = t_in_parallel;
    t_in_parallel = true;
    fn(b, e);
    t_in_parallel = was;
  };
  run(n, chunk, guarded);
}

void WorkerPool::run(int64_t n, int64_t chunk, const RangeFn& fn) {
  std::unique_lock<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  work();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
}

void WorkerPool::work() {
  for (;;) {
    int64_t b = next_.fetch_add(chunk_);
    if (b >= n_) break;
    (*fn_)(b, std::min(n_, b + chunk_));
  }
}

void WorkerPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace xrun
