// Adapts a device backend (lib/device) to the staging arena's registrar hook, so
// the arena is pinned by cudaHostRegister when the CUDA backend is in use.
#pragma once
#include "device/device.h"
#include "io/host_registrar.h"

namespace xpack::io {

class DeviceHostRegistrar final : public HostMemoryRegistrar {
 public:
  explicit DeviceHostRegistrar(device::Device& d) : device_(d) {}
  Status register_host(void* base, size_t bytes) override {
    return device_.register_host(base, bytes);
  }
  void unregister_host(void* base) override { device_.unregister_host(base); }

 private:
  device::Device& device_;
};

}  // namespace xpack::io
