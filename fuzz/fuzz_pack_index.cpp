// libFuzzer target: pack::decode_index over an in-memory pack. The header checksum
// is recomputed over the input first so the fuzzer gets past it into the table
// decoding, and the index checksum is not checked. An index that decodes must
// re-encode (when the encoder accepts it) into bytes that decode again.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pack/format.h"

namespace {

class MemorySource : public xpack::pack::IndexSource {
 public:
  explicit MemorySource(const std::vector<uint8_t>& b) : b_(b) {}
  xpack::Status read(uint64_t off, void* dst, size_t n) override {
    if (off > b_.size() || n > b_.size() - off)
      return xpack::err(XPACK_E_TRUNCATED, "read past the end ({} + {})", off, n);
    std::memcpy(dst, b_.data() + off, n);
    return {};
  }

 private:
  const std::vector<uint8_t>& b_;
};

constexpr size_t kHeaderChecksumAt = 248;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (bytes.size() >= xpack::pack::kHeaderBytes) {
    uint64_t h = xpack::pack::xxh3(bytes.data(), kHeaderChecksumAt);
    std::memcpy(bytes.data() + kHeaderChecksumAt, &h, 8);
  }
  MemorySource src(bytes);
  auto idx = xpack::pack::decode_index(src, bytes.size(), "fuzz.xpack", /*check_index_checksum=*/false);
  if (!idx.ok()) {
    if (idx.error().code >= 0 || idx.error().message.empty()) __builtin_trap();
    return 0;
  }
  auto enc = xpack::pack::encode_index(*idx);
  if (!enc.ok()) return 0;
  if (enc->size() != idx->data_start) __builtin_trap();
  // decode_index reads only [0, data_start) but checks the whole file's size.
  MemorySource again(*enc);
  auto idx2 = xpack::pack::decode_index(again, idx->file_size, "fuzz-reencoded.xpack");
  if (!idx2.ok()) __builtin_trap();
  return 0;
}
