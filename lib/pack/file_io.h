// Small POSIX helpers: full-length pread/pwrite, durable rename.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"

namespace xpack::pack {

// Reads exactly n bytes at off; XPACK_E_TRUNCATED if the file ends first.
Status pread_full(int fd, void* dst, size_t n, uint64_t off, const std::string& name);
Status pwrite_full(int fd, const void* src, size_t n, uint64_t off, const std::string& name);
// fsync of the directory holding `path` (makes a rename/unlink durable).
Status fsync_parent_dir(const std::string& path);
// rename(from, to) then fsync of the directory.
Status durable_rename(const std::string& from, const std::string& to);
// Writes a small file atomically: PATH.tmp, fsync, rename, fsync dir.
Status write_file_atomic(const std::string& path, const std::string& content);
Result<uint64_t> file_size_of(int fd, const std::string& name);

}  // namespace xpack::pack
