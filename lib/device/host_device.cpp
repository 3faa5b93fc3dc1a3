// Host backend of the device layer: "device memory" is ordinary heap memory and
// the copy stream is one worker thread that runs memcpy in FIFO order. Events
// are positions in that FIFO, so their semantics match CUDA events on one stream.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "device/device.h"

namespace xpack::device {
namespace {

class HostDevice;

class HostEvent final : public Event {
 public:
  explicit HostEvent(HostDevice* dev) : dev_(dev) {}
  Result<bool> query() override;
  Status wait() override;
  void* native_handle() override { return nullptr; }
  // Stream position this event waits for; 0 = never recorded (complete).
  uint64_t target = 0;  // guarded by HostDevice::mu_

 private:
  HostDevice* dev_;
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& o) : opts_(o) {
    worker_ = std::thread([this] { run(); });
  }
  ~HostDevice() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
    for (auto& [p, n] : allocations_) std::free(p);
  }

  const char* backend_name() const override { return "host"; }

  Result<MemoryInfo> memory_info() override {
    std::lock_guard lk(mu_);
    return MemoryInfo{opts_.memory_bytes - allocated_, opts_.memory_bytes};
  }

  Result<void*> allocate(size_t bytes) override {
    std::lock_guard lk(mu_);
    if (bytes == 0 || bytes > opts_.memory_bytes - allocated_)
      return err(XPACK_E_DEVICE, "host device: cannot allocate {} bytes ({} of {} in use)",
                 bytes, allocated_, opts_.memory_bytes);
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) return err(-ENOMEM, "host device: out of memory for {} bytes", bytes);
    allocations_[p] = bytes;
    allocated_ += bytes;
    return p;
  }

  void deallocate(void* p) override {
    if (!p) return;
    std::lock_guard lk(mu_);
    auto it = allocations_.find(p);
    if (it == allocations_.end()) return;
    allocated_ -= it->second;
    allocations_.erase(it);
    std::free(p);
  }

  Status register_host(void* p, size_t bytes) override {
    if (!p || bytes == 0) return err(XPACK_E_INVALID_ARG, "register_host: empty range");
    return {};
  }
  void unregister_host(void*) override {}

  Result<std::unique_ptr<Event>> create_event() override {
    return std::unique_ptr<Event>(new HostEvent(this));
  }

  Status copy_to_device_async(void* dst, const void* src, size_t bytes,
                              Event* done) override {
    if ((!dst || !src) && bytes) return err(XPACK_E_INVALID_ARG, "copy: null pointer");
    {
      std::lock_guard lk(mu_);
      queue_.push_back(Op{dst, src, bytes, ++enqueued_});
      if (done) static_cast<HostEvent*>(done)->target = enqueued_;
    }
    work_cv_.notify_one();
    return {};
  }

  // The worker's memcpy does not care which side is "device".
  Status copy_to_host_async(void* dst, const void* src, size_t bytes, Event* done) override {
    return copy_to_device_async(dst, src, bytes, done);
  }

  Status record(Event& e) override {
    std::lock_guard lk(mu_);
    static_cast<HostEvent&>(e).target = enqueued_;
    return {};
  }

  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    XPACK_TRY(synchronize());
    std::memcpy(dst, src, bytes);
    return {};
  }

  Status synchronize() override {
    std::unique_lock lk(mu_);
    uint64_t target = enqueued_;
    done_cv_.wait(lk, [&] { return completed_ >= target; });
    return {};
  }

  Status order_after(void*) override { return {}; }

  bool is_complete(const HostEvent& e) {
    std::lock_guard lk(mu_);
    return completed_ >= e.target;
  }
  void wait_for(const HostEvent& e) {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return completed_ >= e.target; });
  }

 private:
  struct Op {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t seq;
  };

  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left to do
      Op op = queue_.front();
      queue_.pop_front();
      lk.unlock();
      if (op.bytes) std::memcpy(op.dst, op.src, op.bytes);
      if (opts_.copy_bytes_per_second) {
        auto ns = op.bytes * 1'000'000'000ull / opts_.copy_bytes_per_second;
        std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
      }
      lk.lock();
      completed_ = op.seq;
      done_cv_.notify_all();
    }
  }

  HostDeviceOptions opts_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Op> queue_;
  uint64_t enqueued_ = 0;   // sequence number of the last enqueued copy
  uint64_t completed_ = 0;  // sequence number of the last finished copy
  bool stop_ = false;
  uint64_t allocated_ = 0;
  std::unordered_map<void*, size_t> allocations_;
  std::thread worker_;
};

Result<bool> HostEvent::query() { return dev_->is_complete(*this); }
Status HostEvent::wait() {
  dev_->wait_for(*this);
  return {};
}

}  // namespace

std::unique_ptr<Device> make_host_device(const HostDeviceOptions& opts) {
  return std::make_unique<HostDevice>(opts);
}

}  // namespace xpack::device
