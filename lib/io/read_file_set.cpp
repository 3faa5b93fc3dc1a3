#include "io/read_file_set.h"

#include <cstring>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>

namespace xpack::io {

ReadFileSet::~ReadFileSet() {
  for (auto& f : files_)
    if (f.fd >= 0) close(f.fd);
}

std::vector<int> ReadFileSet::fds() const {
  std::vector<int> out;
  for (const auto& f : files_) out.push_back(f.fd);
  return out;
}

Result<std::unique_ptr<ReadFileSet>> ReadFileSet::open(const std::vector<std::string>& paths,
                                                       bool direct_io, int inject_direct_errno) {
  if (paths.empty()) return err(XPACK_E_INVALID_ARG, "no file to read from");
  auto set = std::make_unique<ReadFileSet>();
  for (const auto& path : paths) {
    int flags = O_RDONLY | O_CLOEXEC | (direct_io ? O_DIRECT : 0);
    int fd = -1;
    if (direct_io && inject_direct_errno != 0) {
      errno = inject_direct_errno;
    } else {
      fd = ::open(path.c_str(), flags);
    }
    if (fd < 0) {
      int e = errno;
      if (direct_io && e == EINVAL) {
        // EINVAL from open with a valid path and flags means the filesystem has no
        // direct I/O support.
        return err(XPACK_E_NO_DIRECT_IO,
                   "open({}, O_DIRECT) failed: {}: this filesystem does not support direct I/O "
                   "(tmpfs, some FUSE/network filesystems); move the file to a local disk "
                   "filesystem (ext4, xfs) or ask for buffered reads through the page cache "
                   "(C API: direct_io = XPACK_IO_BUFFERED; counted in fallback_count)",
                   path, strerror(e));
      }
      return Error{-e, fmt::format("open({}) failed: {}", path, strerror(e))};
    }
    struct stat st{};
    if (fstat(fd, &st) != 0) {
      int e = errno;
      close(fd);
      return Error{-e, fmt::format("fstat({}) failed: {}", path, strerror(e))};
    }
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (S_ISBLK(st.st_mode) && ioctl(fd, BLKGETSIZE64, &size) != 0) size = 0;
    set->files_.push_back({path, fd, size});
  }
  return set;
}

}  // namespace xpack::io
