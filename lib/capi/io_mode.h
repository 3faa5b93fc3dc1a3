// The C API's direct_io field (enum xpack_io_mode), shared by the engine and the
// cache options: zero is the default, O_DIRECT, so a zero-filled options struct
// never reads through the page cache by accident.
#pragma once
#include <cstdint>

#include "common/result.h"
#include "xpack/xpack.h"

namespace xpack::capi {

// true: O_DIRECT; false: buffered. 1 is accepted as O_DIRECT (it was the old
// explicit value); anything else is an error rather than a guess.
inline Result<bool> direct_io_from(int32_t v) {
  if (v == XPACK_IO_DIRECT || v == 1) return true;
  if (v == XPACK_IO_BUFFERED) return false;
  return err(XPACK_E_INVALID_ARG,
             "direct_io {} is neither XPACK_IO_DIRECT (0) nor XPACK_IO_BUFFERED (-1)", v);
}

}  // namespace xpack::capi
