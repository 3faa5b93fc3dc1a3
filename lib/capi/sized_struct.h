// The one implementation of the C API's versioned-struct rule (xpack.h, "Conventions";
// doc/api.md). A struct grows only by appending fields, so the caller's size says
// which fields it knows:
//  - single structs begin with `size_t size`, the caller's sizeof(struct);
//  - arrays of element structs carry no size in each element: the call takes the
//    caller's sizeof(element) and libxpack strides by it.
// Either way libxpack reads and writes only the first min(caller's size, its own
// sizeof) bytes, so an older caller's memory beyond its struct is never touched and
// a newer caller's extra fields are left as they were (ignored on input).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "common/result.h"
#include "xpack/xpack.h"

namespace xpack::capi {

// Whether the caller filled in the size field at all.
template <typename T>
bool sized_struct_ok(const T* p) {
  return p && p->size >= sizeof(size_t);
}

// Options in: the caller's fields over `defaults`; fields beyond its struct keep
// their defaults, and the result carries the full size.
template <typename T>
void merge_sized_options(T* defaults, const T& caller) {
  std::memcpy(defaults, &caller, std::min(caller.size, sizeof(T)));
  defaults->size = sizeof(T);
}

// Results out: only the fields the caller's struct has; out->size says how many
// bytes were written.
template <typename T>
void copy_sized_out(T* out, const T& full) {
  size_t n = std::min(out->size, sizeof(T));
  std::memcpy(out, &full, n);
  out->size = n;
}

// An element array's caller size: at least the first version's fields (`v1`, the
// header's XPACK_*_SIZE_V1), or the array cannot be read or written at all.
inline Status check_element_size(size_t elem_size, size_t v1, const char* call, const char* elem) {
  if (elem_size < v1)
    return err(XPACK_E_INVALID_ARG,
               "{}: element size {} is smaller than {} version 1 ({} bytes); pass sizeof({})", call,
               elem_size, elem, v1, elem);
  return {};
}

// Element i of a caller's input array; fields beyond the caller's size are zero,
// which every element field defines as its old behaviour.
template <typename T>
T element_in(const void* base, size_t i, size_t elem_size) {
  T v{};
  std::memcpy(&v, static_cast<const char*>(base) + i * elem_size, std::min(elem_size, sizeof(T)));
  return v;
}

// Writes element i of a caller's output array: only the bytes the caller's element has.
template <typename T>
void element_out(void* base, size_t i, size_t elem_size, const T& v) {
  std::memcpy(static_cast<char*>(base) + i * elem_size, &v, std::min(elem_size, sizeof(T)));
}

}  // namespace xpack::capi
