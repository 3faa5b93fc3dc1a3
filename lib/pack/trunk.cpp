#include "pack/trunk.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "pack/file_io.h"
#include "pack/identity.h"

namespace xpack::pack {

Result<gguf::Writer> trunk_layout(const gguf::File& meta, const std::vector<gguf::TensorInfo>& tensors,
                                  const Index& idx) {
  if (meta.alignment() == 0 || meta.alignment() > UINT32_MAX)
    return err(XPACK_E_FORMAT, "{}: alignment {}", meta.path(), meta.alignment());
  gguf::Writer w(static_cast<uint32_t>(meta.alignment()));
  for (const gguf::KeyValue& kv : meta.kvs()) {
    if (kv.key.starts_with("split.")) continue;
    if (kv.key.starts_with("xpack."))
      return err(XPACK_E_UNSUPPORTED, "{}: source already carries '{}' (is it a trunk? build from the original "
                 "model)", meta.path(), kv.key);
    w.add_kv(kv);
  }
  w.add_kv(kTrunkIdentityKey, gguf::val::str(to_hex(idx.source_identity)));
  w.add_kv(kTrunkFormatKey, gguf::val::u32(idx.version));
  for (const gguf::TensorInfo& t : tensors)
    w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
  return w;
}

Status write_trunk(const std::string& path, const gguf::Writer& w, const std::vector<gguf::TensorInfo>& tensors,
                   const std::vector<const gguf::File*>& shards, std::vector<uint8_t>& buf,
                   const std::function<void(uint64_t)>& on_bytes) {
  XPACK_ASSIGN_OR_RETURN(std::vector<uint8_t> header, w.header_bytes());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("create {}", path);
  auto run = [&]() -> Status {
    // Gaps between tensors and the tail padding stay zero: the file is sized first.
    if (::ftruncate(fd, static_cast<off_t>(w.total_size())) != 0) return errno_error("resize {}", path);
    XPACK_TRY(pwrite_full(fd, header.data(), header.size(), 0, path));
    bool use_copy_range = true;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const gguf::TensorInfo& t = tensors[i];
      if (w.tensor_nbytes(i) != t.nbytes)
        return err(XPACK_E_INTERNAL, "trunk tensor {}: {} bytes vs {}", t.name, w.tensor_nbytes(i), t.nbytes);
      const gguf::File* src = shards[t.shard];
      uint64_t dst = w.data_offset() + w.tensor_offset(i);
      uint64_t done = 0;
      // In-kernel copy first (no trip through user memory); the buffer loop is the
      // fallback for file systems / kernels that refuse it.
      while (use_copy_range && done < t.nbytes) {
        loff_t in = static_cast<loff_t>(t.file_offset + done), o = static_cast<loff_t>(dst + done);
        size_t n = static_cast<size_t>(std::min<uint64_t>(64ull << 20, t.nbytes - done));
        ssize_t r = ::copy_file_range(src->fd(), &in, fd, &o, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          use_copy_range = false;
          break;
        }
        done += static_cast<uint64_t>(r);
        if (on_bytes) on_bytes(static_cast<uint64_t>(r));
      }
      while (done < t.nbytes) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), t.nbytes - done));
        XPACK_TRY(pread_full(src->fd(), buf.data(), n, t.file_offset + done, src->path()));
        XPACK_TRY(pwrite_full(fd, buf.data(), n, dst + done, path));
        done += n;
        if (on_bytes) on_bytes(n);
      }
    }
    if (::fsync(fd) != 0) return errno_error("fsync {}", path);
    return {};
  };
  Status s = run();
  ::close(fd);
  return s;
}

}  // namespace xpack::pack
