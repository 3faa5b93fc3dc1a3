// SHA-256 identities of source GGUF files (OpenSSL EVP).
#include "pack/identity.h"

#include <unistd.h>

#include <cstring>
#include <memory>

#include <openssl/evp.h>

namespace xpack::pack {

namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

MdCtx new_sha256() {
  MdCtx c(EVP_MD_CTX_new());
  if (c && EVP_DigestInit_ex(c.get(), EVP_sha256(), nullptr) != 1) c.reset();
  return c;
}

Sha256 finish(EVP_MD_CTX* c) {
  Sha256 out{};
  unsigned len = 0;
  EVP_DigestFinal_ex(c, out.data(), &len);
  return out;
}

void put_le64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

}  // namespace

Sha256 sha256_bytes(const void* data, size_t n) {
  MdCtx c = new_sha256();
  EVP_DigestUpdate(c.get(), data, n);
  return finish(c.get());
}

Result<Sha256> sha256_file_prefix(int fd, uint64_t n, const std::string& name) {
  MdCtx c = new_sha256();
  if (!c) return err(XPACK_E_INTERNAL, "OpenSSL: cannot create a SHA-256 context");
  std::vector<uint8_t> buf(std::min<uint64_t>(n, 1 << 20));
  uint64_t off = 0;
  while (off < n) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - off));
    ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_error("{}: read metadata at {}", name, off);
    }
    if (r == 0) return err(XPACK_E_TRUNCATED, "{}: file ends at {} inside its metadata", name, off);
    EVP_DigestUpdate(c.get(), buf.data(), static_cast<size_t>(r));
    off += static_cast<uint64_t>(r);
  }
  return finish(c.get());
}

Result<ShardIdentity> shard_identity(int fd, uint64_t data_offset, uint64_t file_size,
                                     uint64_t tensor_count, const std::string& name) {
  ShardIdentity s;
  XPACK_ASSIGN_OR_RETURN(s.metadata_sha256, sha256_file_prefix(fd, data_offset, name));
  s.metadata_bytes = data_offset;
  s.file_size = file_size;
  s.tensor_count = tensor_count;
  return s;
}

Sha256 combine_identity(const std::vector<ShardIdentity>& shards) {
  static const char kTag[] = "xpack-source-identity-v1";
  MdCtx c = new_sha256();
  EVP_DigestUpdate(c.get(), kTag, sizeof kTag - 1);
  for (const ShardIdentity& s : shards) {
    uint8_t rec[32 + 24];
    std::memcpy(rec, s.metadata_sha256.data(), 32);
    put_le64(rec + 32, s.metadata_bytes);
    put_le64(rec + 40, s.file_size);
    put_le64(rec + 48, s.tensor_count);
    EVP_DigestUpdate(c.get(), rec, sizeof rec);
  }
  return finish(c.get());
}

std::string to_hex(const uint8_t* p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

}  // namespace xpack::pack
