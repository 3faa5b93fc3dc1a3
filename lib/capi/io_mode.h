// Option values of the read path whose zero must be the safe default: direct_io
// (enum xpack_io_mode), shared by the engine and the cache options: zero is O_DIRECT,
// so a zero-filled options struct never reads through the page cache by accident;
// and the cache's verify.
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

// The cache's verify field (enum xpack_verify_mode): zero, the default, checks every
// object, so a zero-filled struct never lets unchecked bytes through.
inline Result<bool> verify_from(int32_t v) {
  if (v == XPACK_VERIFY_ON || v == 1) return true;
  if (v == XPACK_VERIFY_OFF) return false;
  return err(XPACK_E_INVALID_ARG, "verify {} is neither XPACK_VERIFY_ON (0) nor XPACK_VERIFY_OFF (-1)", v);
}

}  // namespace xpack::capi
