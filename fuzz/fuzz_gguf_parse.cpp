// libFuzzer target: gguf::File::parse over an in-memory file. Any input must give
// a File or an Error; a crash, sanitizer report, leak or huge allocation is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf/gguf_file.h"

namespace {

class MemorySource : public xpack::gguf::ByteSource {
 public:
  MemorySource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t size() const override { return size_; }
  xpack::Status read(uint64_t off, void* dst, size_t n) override {
    if (off > size_ || n > size_ - off) __builtin_trap();  // the reader promised to stay in bounds
    std::memcpy(dst, data_ + off, n);
    return {};
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemorySource src(data, size);
  auto f = xpack::gguf::File::parse(src, "fuzz.gguf");
  if (!f.ok()) {
    if (f.error().code >= 0 || f.error().message.empty()) __builtin_trap();
    return 0;
  }
  // A parsed file must be internally consistent.
  for (const auto& t : f->tensors()) {
    if (t.file_offset != f->data_offset() + t.offset) __builtin_trap();
    if (t.file_offset + t.nbytes > size) __builtin_trap();
    if (f->find_tensor(t.name) != &t) __builtin_trap();
  }
  for (const auto& kv : f->kvs()) {
    if (!f->find(kv.key)) __builtin_trap();
    (void)f->get_int(kv.key);
    (void)f->get_uint(kv.key);
    (void)f->get_string(kv.key);
  }
  return 0;
}
