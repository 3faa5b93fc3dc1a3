#include "pack/trunk.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <xxhash.h>

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
  // Placeholders of the final size: the real values are written with the data.
  w.add_kv(kTrunkChecksumsKey, gguf::val::u64_array(std::vector<uint64_t>(tensors.size(), 0)));
  for (const gguf::TensorInfo& t : tensors)
    w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
  return w;
}

namespace {

// xxh3-64 of [off, off + n) of fd, read through buf.
Result<uint64_t> hash_range(int fd, uint64_t off, uint64_t n, std::vector<uint8_t>& buf, const std::string& path) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) return err(-ENOMEM, "xxh3 state");
  XXH3_64bits_reset(st);
  Status s;
  for (uint64_t done = 0; done < n && s.ok();) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - done));
    s = pread_full(fd, buf.data(), k, off + done, path);
    if (s.ok()) XXH3_64bits_update(st, buf.data(), k);
    done += k;
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (!s.ok()) return s.error();
  return h;
}

}  // namespace

Status write_trunk(const std::string& path, gguf::Writer& w, const std::vector<gguf::TensorInfo>& tensors,
                   const std::vector<const gguf::File*>& shards, std::vector<uint8_t>& buf,
                   const std::function<void(uint64_t)>& on_bytes) {
  XPACK_ASSIGN_OR_RETURN(std::vector<uint8_t> header, w.header_bytes());
  // Read-write: the checksums are computed from what was written.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
    // Checksums of what is in the file now (hashed from the page cache, so cheap),
    // so later damage to the trunk is found by --verify even with the source gone.
    std::vector<uint64_t> sums(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      XPACK_ASSIGN_OR_RETURN(sums[i], hash_range(fd, w.data_offset() + w.tensor_offset(i), tensors[i].nbytes,
                                                buf, path));
    }
    XPACK_TRY(w.set_kv(kTrunkChecksumsKey, gguf::val::u64_array(sums)));
    XPACK_ASSIGN_OR_RETURN(std::vector<uint8_t> final_header, w.header_bytes());
    if (final_header.size() != header.size())
      return err(XPACK_E_INTERNAL, "trunk header changed size with its checksums ({} vs {} bytes)",
                 final_header.size(), header.size());
    XPACK_TRY(pwrite_full(fd, final_header.data(), final_header.size(), 0, path));
    if (::fsync(fd) != 0) return errno_error("fsync {}", path);
    return {};
  };
  Status s = run();
  ::close(fd);
  return s;
}

}  // namespace xpack::pack

namespace xpack::pack {

Status verify_trunk(const std::string& path, std::string* bad_tensor) {
  XPACK_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(path));
  // An original source file accepted as the trunk (check_identity): no checksums of
  // ours, and its bytes are the source's own.
  if (!f.find(kTrunkIdentityKey)) return {};
  const gguf::Value* v = f.find(kTrunkChecksumsKey);
  if (!v)
    return err(XPACK_E_UNSUPPORTED, "{}: the trunk has no {} (built by an older xpack-build): rebuild it to verify it",
               path, kTrunkChecksumsKey);
  if (v->type != gguf::ValueType::ARRAY || v->elem_type != gguf::ValueType::U64 ||
      v->array_size() != f.tensors().size())
    return err(XPACK_E_FORMAT, "{}: {} is not a u64 array with one entry per tensor ({} tensors)", path,
               kTrunkChecksumsKey, f.tensors().size());
  std::vector<uint8_t> buf(4u << 20);
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    XPACK_ASSIGN_OR_RETURN(uint64_t h, hash_range(f.fd(), t.file_offset, t.nbytes, buf, path));
    if (h != v->element(i).u) {
      if (bad_tensor) *bad_tensor = t.name;
      return err(XPACK_E_CHECKSUM, "{}: trunk tensor '{}' is damaged (xxh3 {:016x}, recorded {:016x})", path,
                 t.name, h, v->element(i).u);
    }
  }
  return {};
}

}  // namespace xpack::pack
