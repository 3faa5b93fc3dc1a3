// A fixed set of worker threads running parallel loops. Work is split by
// items (output rows, heads, tokens), each item computed by one thread, so
// results never depend on the thread count. The CPU backend owns one (its
// "stream"); the direct pack reader owns another for its reads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xrun {

// All cores, at most 64 (never 0).
int default_threads();

class WorkerPool {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;
  // n_threads <= 0: default_threads(). The calling thread is one of them.
  explicit WorkerPool(int n_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn over [0, n) in chunks on the pool; inline when called from inside
  // a parallel loop, or when the whole job is too small to pay for waking the
  // workers (work_per_item: a rough count of multiply-adds per item; 0: split
  // whenever there is more than one item). One loop runs at a time.
  void parallel_for(int64_t n, int64_t work_per_item, const RangeFn& fn);

 private:
  void run(int64_t n, int64_t chunk, const RangeFn& fn);
  void work();
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace xrun
