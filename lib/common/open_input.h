// Opening a file libxpack reads: refuses anything but a regular file (and, where
// the caller reads raw devices, a block device) BEFORE it can block. A plain
// open() of a FIFO waits for a writer forever, so the type check after it came too
// late: the file is opened O_NONBLOCK, checked with fstat, and only then switched
// back to blocking reads.
#pragma once
#include <string>
#include <sys/stat.h>

#include "common/result.h"

namespace xpack {

struct InputFile {
  int fd = -1;  // owned by the caller
  struct stat st{};
};

// flags: the access flags (O_RDONLY, maybe O_DIRECT); O_CLOEXEC is added.
// Errors: -errno from open/fstat (with the path), XPACK_E_INVALID_ARG for a
// FIFO, directory, socket or character device (naming what it is).
Result<InputFile> open_input(const std::string& path, int flags, bool allow_block_device = false);

}  // namespace xpack
