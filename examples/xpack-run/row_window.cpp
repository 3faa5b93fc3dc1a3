#include "row_window.h"

#include <algorithm>

#include "xpack/xpack.h"

namespace xrun {

void RowWindow::reset(Backend& be) {
  buf_ = be.alloc(XPACK_TYPE_F32, width_, 0);
  start_ = first_ = end_ = 0;
}

Tensor RowWindow::append_rows(Backend& be, int64_t n) {
  const int64_t count = end_ - first_;
  if (start_ + count + n > buf_.rows()) {
    // Move the kept rows to the front of a buffer with room for twice as many.
    Tensor grown = be.alloc(XPACK_TYPE_F32, width_, std::max<int64_t>(2 * (count + n), 16));
    if (count > 0) be.copy(view(), grown.row_range(0, count));
    buf_ = grown;
    start_ = 0;
  }
  end_ += n;
  return buf_.row_range(start_ + count, n);
}

void RowWindow::drop_before(int64_t pos) {
  if (pos <= first_) return;
  const int64_t drop = std::min(pos, end_) - first_;
  start_ += drop;
  first_ += drop;
}

}  // namespace xrun
