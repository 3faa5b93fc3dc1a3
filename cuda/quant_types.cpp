// The type table and status names of the compute kernels (plain C++: it also
// gives the kernel library a C++ source, so Meson links its users with the C++
// linker).
#include "quant_matmul.h"

namespace xpack::kernels {

const char* status_name(int status) {
  switch (status) {
    case kOk: return "ok";
    case kErrType: return "unsupported weight type";
    case kErrShape: return "bad shape (ne0 not a whole number of blocks, or out of range)";
    case kErrArgument: return "bad argument";
    case kErrAlignment: return "pointer not aligned (w, x: 16 bytes)";
    case kErrCuda: return "CUDA error";
    case kErrCublas: return "cuBLAS error";
    case kErrWorkspace: return "workspace too small for one row";
    default: return "unknown status";
  }
}

const char* type_name(uint32_t type) {
  switch (type) {
    case kF32: return "f32";
    case kF16: return "f16";
    case kBF16: return "bf16";
    case kQ8_0: return "q8_0";
    case kQ2_K: return "q2_K";
    case kQ3_K: return "q3_K";
    case kQ4_K: return "q4_K";
    case kQ5_K: return "q5_K";
    case kQ6_K: return "q6_K";
    case kMXFP4: return "mxfp4";
    default: return "?";
  }
}

int block_elems(uint32_t type) {
  switch (type) {
    case kF32: case kF16: case kBF16: return 1;
    case kQ8_0: case kMXFP4: return 32;
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ5_K: case kQ6_K: return 256;
    default: return 0;
  }
}

int block_bytes(uint32_t type) {
  switch (type) {
    case kF32: return 4;
    case kF16: case kBF16: return 2;
    case kQ8_0: return 34;
    case kMXFP4: return 17;
    case kQ2_K: return 84;
    case kQ3_K: return 110;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    case kQ6_K: return 210;
    default: return 0;
  }
}

size_t row_bytes(uint32_t type, int64_t ne0) {
  const int be = block_elems(type);
  if (be == 0 || ne0 <= 0 || ne0 % be != 0) return 0;
  return size_t(ne0 / be) * size_t(block_bytes(type));
}

}  // namespace xpack::kernels
