// Rows of consecutive positions [first(), end()) kept in one backend tensor:
// per-sequence state that only needs its most recent rows (a sliding window
// of keys, the rows a future compressed block still pools). Appending is a
// backend copy (moving the kept rows to a new buffer when full), forgetting
// only moves the start, so the rows never leave the device.
#pragma once

#include <cstdint>

#include "backend.h"

namespace xrun {

class RowWindow {
 public:
  explicit RowWindow(int64_t width = 1) : width_(width) {}
  void reset(Backend& be);
  // rows [n][width] become positions end() .. end() + n - 1.
  void append(Backend& be, const Tensor& rows);
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
