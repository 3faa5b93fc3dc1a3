// The device layer: memory for cache slots, one copy stream for the transfers
// between host and device, and events that say when the copies enqueued before them are done.
// Two backends implement it: CUDA (cuda/) and host (plain memory, memcpy on a
// worker thread) so the whole cache is testable on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"

namespace xpack::device {

// Marks a point in the copy stream. Like a CUDA event: an event never recorded
// counts as complete; record() makes it pending until every copy enqueued before
// the record has finished. Thread-safe.
class Event {
 public:
  virtual ~Event() = default;
  // True when complete; an error if the stream failed.
  virtual Result<bool> query() = 0;
  // Blocks the calling thread until complete.
  virtual Status wait() = 0;
  // The backend's own handle (cudaEvent_t for CUDA) so a compute stream can wait
  // on it without blocking the host; nullptr for the host backend.
  virtual void* native_handle() = 0;
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

// All methods are thread-safe. Copies are executed in the order they were
// enqueued (one stream), so an event recorded after a copy covers every earlier copy.
class Device {
 public:
  virtual ~Device() = default;
  virtual const char* backend_name() const = 0;
  // Free device memory right now (used to size the cache budget).
  virtual Result<MemoryInfo> memory_info() = 0;
  // Device memory for slots; aligned to at least 256 bytes.
  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  // Pins a host range (the staging arena) so copies from it are asynchronous DMA.
  virtual Status register_host(void* p, size_t bytes) = 0;
  virtual void unregister_host(void* p) = 0;
  virtual Result<std::unique_ptr<Event>> create_event() = 0;
  // Enqueues a host->device copy and then records `done` (may be null) after it,
  // as one step so copies from other threads cannot slip in between.
  virtual Status copy_to_device_async(void* dst, const void* src, size_t bytes,
                                      Event* done) = 0;
  // Enqueues a device->host copy (the host tier's demotions) and records `done`
  // (may be null) after it. On the same stream as the host->device copies, so a
  // slot is read before a later copy overwrites it and a host range is written
  // before a later copy reads it: the tier needs no other ordering.
  virtual Status copy_to_host_async(void* dst, const void* src, size_t bytes, Event* done) = 0;
  // Records `e` after everything enqueued so far.
  virtual Status record(Event& e) = 0;
  // Synchronous device->host copy, ordered after all enqueued copies (tests,
  // verification of slot contents).
  virtual Status copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // Blocks until the copy stream is drained.
  virtual Status synchronize() = 0;
  // Makes copies enqueued from now on wait for the work already enqueued on a
  // caller's stream (cudaStream_t for CUDA; ignored by the host backend, whose
  // "compute" is synchronous). Used when slots are released while kernels that
  // read them may still be running. nullptr = nothing to wait for.
  virtual Status order_after(void* foreign_stream) = 0;
};

struct HostDeviceOptions {
  // Memory the host "device" pretends to have, so budgets can be tested.
  uint64_t memory_bytes = uint64_t{1} << 34;
  // Artificial bandwidth limit in bytes/s for copies (0 = none), to make
  // copies observably asynchronous in tests.
  uint64_t copy_bytes_per_second = 0;
};

std::unique_ptr<Device> make_host_device(const HostDeviceOptions& opts = {});

// The CUDA backend on device `ordinal`; XPACK_E_UNSUPPORTED when libxpack was
// built without CUDA, XPACK_E_DEVICE when there is no usable GPU.
Result<std::unique_ptr<Device>> make_cuda_device(int ordinal);

}  // namespace xpack::device
