// CUDA backend of the device layer (lib/device/device.h): slots in cudaMalloc'd
// memory, the staging arena pinned with cudaHostRegister, copies with
// cudaMemcpyAsync on one dedicated non-blocking stream, one cudaEvent per
// Event. Every entry point selects the device first because the cache calls it
// from its own I/O thread as well as from callers' threads.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "device/device.h"

namespace xpack::device {
namespace {

Error cuda_error(cudaError_t e, const char* what) {
  return Error{XPACK_E_DEVICE, std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                                   cudaGetErrorString(e) + ")"};
}

#define XPACK_CUDA_TRY(call)                              \
  do {                                                    \
    cudaError_t xpack_cuda_e_ = (call);                   \
    if (xpack_cuda_e_ != cudaSuccess) return cuda_error(xpack_cuda_e_, #call); \
  } while (0)

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t ev) : ordinal_(ordinal), ev_(ev) {}
  ~CudaEvent() override {
    cudaSetDevice(ordinal_);
    cudaEventDestroy(ev_);
  }
  Result<bool> query() override {
    cudaSetDevice(ordinal_);
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return cuda_error(e, "cudaEventQuery");
  }
  Status wait() override {
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    XPACK_CUDA_TRY(cudaEventSynchronize(ev_));
    return {};
  }
  void* native_handle() override { return ev_; }
  cudaEvent_t get() const { return ev_; }

 private:
  int ordinal_;
  cudaEvent_t ev_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, cudaStream_t s, cudaEvent_t fence)
      : ordinal_(ordinal), stream_(s), fence_(fence) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(fence_);
    cudaStreamDestroy(stream_);
  }

  const char* backend_name() const override { return "cuda"; }

  Result<MemoryInfo> memory_info() override {
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    size_t free_b = 0, total_b = 0;
    XPACK_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    return MemoryInfo{free_b, total_b};
  }

  Result<void*> allocate(size_t bytes) override {
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    void* p = nullptr;
    XPACK_CUDA_TRY(cudaMalloc(&p, bytes));
    return p;
  }

  void deallocate(void* p) override {
    if (!p) return;
    cudaSetDevice(ordinal_);
    cudaFree(p);
  }

  Status register_host(void* p, size_t bytes) override {
    if (!p || bytes == 0) return Error{XPACK_E_INVALID_ARG, "register_host: empty range"};
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    XPACK_CUDA_TRY(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
    return {};
  }

  void unregister_host(void* p) override {
    cudaSetDevice(ordinal_);
    cudaHostUnregister(p);
  }

  Result<std::unique_ptr<Event>> create_event() override {
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    cudaEvent_t ev;
    XPACK_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, ev));
  }

  Status copy_to_device_async(void* dst, const void* src, size_t bytes, Event* done) override {
    if ((!dst || !src) && bytes) return Error{XPACK_E_INVALID_ARG, "copy: null pointer"};
    std::lock_guard lk(mu_);  // copy + record as one step on the stream
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    XPACK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    if (done) XPACK_CUDA_TRY(cudaEventRecord(static_cast<CudaEvent*>(done)->get(), stream_));
    return {};
  }

  Status copy_to_host_async(void* dst, const void* src, size_t bytes, Event* done) override {
    if ((!dst || !src) && bytes) return Error{XPACK_E_INVALID_ARG, "copy: null pointer"};
    std::lock_guard lk(mu_);
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    XPACK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    if (done) XPACK_CUDA_TRY(cudaEventRecord(static_cast<CudaEvent*>(done)->get(), stream_));
    return {};
  }

  Status record(Event& e) override {
    std::lock_guard lk(mu_);
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    XPACK_CUDA_TRY(cudaEventRecord(static_cast<CudaEvent&>(e).get(), stream_));
    return {};
  }

  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    {
      std::lock_guard lk(mu_);
      XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
      XPACK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    return synchronize();
  }

  Status synchronize() override {
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    XPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
    return {};
  }

  Status order_after(void* foreign_stream) override {
    if (!foreign_stream) return {};
    std::lock_guard lk(mu_);
    XPACK_CUDA_TRY(cudaSetDevice(ordinal_));
    // The wait captures the fence's state at this call, so one event serves all.
    XPACK_CUDA_TRY(cudaEventRecord(fence_, static_cast<cudaStream_t>(foreign_stream)));
    XPACK_CUDA_TRY(cudaStreamWaitEvent(stream_, fence_, 0));
    return {};
  }

 private:
  int ordinal_;
  cudaStream_t stream_;
  cudaEvent_t fence_;
  std::mutex mu_;
};

}  // namespace

Result<std::unique_ptr<Device>> make_cuda_device(int ordinal) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return cuda_error(e, "cudaGetDeviceCount");
  if (ordinal < 0 || ordinal >= count)
    return Error{XPACK_E_DEVICE, "CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                     std::to_string(count) + " found)"};
  XPACK_CUDA_TRY(cudaSetDevice(ordinal));
  cudaStream_t s;
  XPACK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t fence;
  e = cudaEventCreateWithFlags(&fence, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaStreamDestroy(s);
    return cuda_error(e, "cudaEventCreate");
  }
  return std::unique_ptr<Device>(new CudaDevice(ordinal, s, fence));
}

}  // namespace xpack::device
