// xpack_strerror and the thread-local last-error message.
#include <cstring>
#include <string>

#include "common/result.h"
#include "common/last_error.h"

namespace xpack {

static thread_local std::string t_last_error;

void set_last_error(const std::string& message) { t_last_error = message; }
const char* last_error() { return t_last_error.c_str(); }

}  // namespace xpack

extern "C" XPACK_API const char* xpack_last_error(void) { return xpack::last_error(); }

extern "C" XPACK_API const char* xpack_strerror(int code) {
  switch (code) {
    case XPACK_OK: return "success";
    case XPACK_E_INVALID_ARG: return "invalid argument";
    case XPACK_E_FORMAT: return "malformed file";
    case XPACK_E_TRUNCATED: return "file is truncated";
    case XPACK_E_BAD_MAGIC: return "bad magic (wrong file type)";
    case XPACK_E_VERSION: return "unsupported format version";
    case XPACK_E_CHECKSUM: return "header or index checksum mismatch";
    case XPACK_E_SIZE_MISMATCH: return "file size differs from the size the header implies";
    case XPACK_E_MISALIGNED: return "offset, length or buffer is not aligned";
    case XPACK_E_IDENTITY: return "pack does not belong to this model";
    case XPACK_E_UNKNOWN_TYPE: return "unknown ggml tensor type";
    case XPACK_E_NOT_FOUND: return "not found";
    case XPACK_E_TYPE: return "value has a different type";
    case XPACK_E_OBJECT_CHECKSUM: return "expert object checksum mismatch";
    case XPACK_E_SPLIT: return "inconsistent or incomplete GGUF split set";
    case XPACK_E_LIMIT: return "count or size beyond limits";
    case XPACK_E_UNSUPPORTED: return "unsupported input";
    case XPACK_E_NO_DIRECT_IO: return "O_DIRECT not supported here (buffered mode not requested)";
    case XPACK_E_CAPACITY: return "cache budget is smaller than top-k experts";
    case XPACK_E_OVERLAP: return "tensors overlap";
    case XPACK_E_DUPLICATE: return "duplicate name";
    case XPACK_E_URING: return "io_uring is not available";
    case XPACK_E_DEVICE: return "device backend error";
    case XPACK_E_INTERNAL: return "internal error";
    default: break;
  }
  if (code < 0 && code > XPACK_E_BASE) return strerror(-code);
  return "unknown error code";
}
