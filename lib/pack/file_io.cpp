#include "pack/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace xpack::pack {

Status pread_full(int fd, void* dst, size_t n, uint64_t off, const std::string& name) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_error("{}: read {} bytes at {}", name, n, off);
    }
    if (r == 0) return err(XPACK_E_TRUNCATED, "{}: file ends at {} ({} more bytes expected)", name, off, n);
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return {};
}

Status pwrite_full(int fd, const void* src, size_t n, uint64_t off, const std::string& name) {
  auto* p = static_cast<const uint8_t*>(src);
  while (n > 0) {
    ssize_t r = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_error("{}: write {} bytes at {}", name, n, off);
    }
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return {};
}

Status fsync_parent_dir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_error("open directory {}", dir.string());
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) {
    errno = e;
    return errno_error("fsync directory {}", dir.string());
  }
  return {};
}

Status durable_rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return errno_error("rename {} -> {}", from, to);
  return fsync_parent_dir(to);
}

Status write_file_atomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("create {}", tmp);
  Status s = pwrite_full(fd, content.data(), content.size(), 0, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = errno_error("fsync {}", tmp);
  ::close(fd);
  if (!s.ok()) return s;
  return durable_rename(tmp, path);
}

Result<uint64_t> file_size_of(int fd, const std::string& name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno_error("stat {}", name);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace xpack::pack
