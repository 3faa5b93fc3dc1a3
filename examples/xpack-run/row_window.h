// Rows of consecutive positions [first(), end()) kept in one backend tensor:
// per-sequence state that only needs its most recent rows (a sliding window
// of keys, the rows a future compressed block still pools). New rows are
// written in place by the operation that computes them (the kept rows move to
// a new buffer when it is full), forgetting only moves the start, so the rows
// never leave the device and are never copied but to grow.
#pragma once

#include <cstdint>

#include "backend.h"

namespace xrun {

class RowWindow {
 public:
  explicit RowWindow(int64_t width = 1) : width_(width) {}
  void reset(Backend& be);
  // The rows [n][width] of positions end() .. end() + n - 1, which end() now
  // includes: the caller writes them before reading view().
  Tensor append_rows(Backend& be, int64_t n);
  // Forgets the rows of positions below pos.
  void drop_before(int64_t pos);
  // [end() - first()][width]: row r is position first() + r.
  Tensor view() const { return buf_.row_range(start_, end_ - first_); }
  int64_t first() const { return first_; }
  int64_t end() const { return end_; }

 private:
  int64_t width_;
  Tensor buf_;
  int64_t start_ = 0;  // buffer row of position first_
  int64_t first_ = 0, end_ = 0;
};

}  // namespace xrun
