// make_cuda_device for builds without CUDA: the CUDA backend lives in cuda/ and
// is compiled only with -Dcuda; this keeps callers free of #ifdefs.
#ifndef XPACK_HAVE_CUDA
#include "device/device.h"

namespace xpack::device {
Result<std::unique_ptr<Device>> make_cuda_device(int) {
  return err(XPACK_E_UNSUPPORTED, "libxpack was built without CUDA (-Dcuda=disabled)");
}
}  // namespace xpack::device
#endif
