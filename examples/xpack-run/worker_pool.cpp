// The worker pool behind parallel_for: the CPU backend's "stream" runs each
// operation on the calling thread plus these workers.
#include "worker_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace xrun {

// --- worker pool ---------------------------------------------------------------

namespace {

// A fixed set of workers that run one parallel_for at a time. Work is handed
// out in chunks through an atomic counter; the caller works too.
class WorkerPool {
 public:
  explicit WorkerPool(int n_threads) {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
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

 private:
  void work() {
    for (;;) {
      int64_t b = next_.fetch_add(chunk_);
      if (b >= n_) break;
      (*fn_)(b, std::min(n_, b + chunk_));
    }
  }
  void worker_loop() {
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

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

int g_threads = 0;
std::unique_ptr<WorkerPool> g_pool;
std::mutex g_pool_mu;
thread_local bool t_in_parallel = false;

WorkerPool& pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<WorkerPool>(threads());
  return *g_pool;
}

}  // namespace

void set_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_threads = n;
  g_pool.reset();
}

int threads() {
  if (g_threads > 0) return g_threads;
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(std::min(hc, 64u));
}

void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return;
  WorkerPool* p = (t_in_parallel || threads() == 1 || n == 1) ? nullptr : &pool();
  if (!p || p->size() == 1) {
    fn(0, n);
    return;
  }
  // About four chunks per worker balances uneven rows without much overhead.
  int64_t chunk = std::max<int64_t>(1, n / (int64_t(p->size()) * 4));
  t_in_parallel = true;
  auto guarded = [&](int64_t b, int64_t e) {
    bool was = t_in_parallel;
    t_in_parallel = true;
    fn(b, e);
    t_in_parallel = was;
  };
  p->run(n, chunk, guarded);
  t_in_parallel = false;
}

void parallel_for_work(int64_t n, int64_t work_per_item,
                       const std::function<void(int64_t begin, int64_t end)>& fn) {
  constexpr int64_t kInlineWork = 1 << 16;
  if (n <= 0) return;
  if (work_per_item > 0 && n <= kInlineWork / work_per_item) {
    fn(0, n);
    return;
  }
  parallel_for(n, fn);
}

}  // namespace xrun
