#include "common/open_input.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace xpack {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

}  // namespace

Result<InputFile> open_input(const std::string& path, int flags, bool allow_block_device) {
  InputFile f;
  f.fd = ::open(path.c_str(), flags | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) {
    int e = errno;
    return Error{-e, fmt::format("cannot open '{}': {}", path, strerror(e))};
  }
  if (::fstat(f.fd, &f.st) != 0) {
    int e = errno;
    ::close(f.fd);
    return Error{-e, fmt::format("cannot stat '{}': {}", path, strerror(e))};
  }
  const bool ok = S_ISREG(f.st.st_mode) || (allow_block_device && S_ISBLK(f.st.st_mode));
  if (!ok) {
    ::close(f.fd);
    return err(XPACK_E_INVALID_ARG, "'{}' is {}, not a regular file{}", path, kind_of(f.st.st_mode),
               allow_block_device ? " or block device" : "");
  }
  // Back to blocking reads: O_NONBLOCK was only for the open, and a descriptor
  // handed on (io_uring, pread loops) must not carry it.
  int fl = ::fcntl(f.fd, F_GETFL);
  if (fl < 0 || ::fcntl(f.fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    ::close(f.fd);
    return Error{-e, fmt::format("fcntl '{}': {}", path, strerror(e))};
  }
  return f;
}

}  // namespace xpack
