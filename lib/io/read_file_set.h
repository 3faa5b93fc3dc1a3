// The files an engine reads from, opened read-only with O_DIRECT (or buffered
// when explicitly asked). O_DIRECT refused (tmpfs on older kernels, some FUSE and
// network filesystems) fails closed with XPACK_E_NO_DIRECT_IO: falling back to
// the page cache silently would double memory traffic and hide a slow setup.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace xpack::io {

struct OpenedFile {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
};

class ReadFileSet {
 public:
  ReadFileSet() = default;
  ~ReadFileSet();
  ReadFileSet(const ReadFileSet&) = delete;
  ReadFileSet& operator=(const ReadFileSet&) = delete;

  // inject_direct_errno: test hook, pretend open(O_DIRECT) failed with it.
  static Result<std::unique_ptr<ReadFileSet>> open(const std::vector<std::string>& paths,
                                                   bool direct_io, int inject_direct_errno = 0);
  size_t size() const { return files_.size(); }
  const OpenedFile& at(size_t i) const { return files_[i]; }
  std::vector<int> fds() const;

 private:
  std::vector<OpenedFile> files_;
};

}  // namespace xpack::io
