// C API structs begin with `size_t size`, set by the caller to the size of the
// struct it was compiled with, so an older (shorter) struct keeps working after
// fields are appended. These are the two directions of that contract.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

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

}  // namespace xpack::capi
