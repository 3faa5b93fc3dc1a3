#include "stop_strings.h"

#include <algorithm>

namespace xrun {

std::string StopScanner::feed(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  // Every byte released so far was checked not to start a stop string, so a
  // match can only begin inside pending_.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail of pending_ that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopScanner::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

std::string check_stop_strings(const std::vector<std::string>& stops) {
  for (const std::string& s : stops)
    if (s.empty()) return "--stop: an empty stop string would end generation before the first token";
  return {};
}

}  // namespace xrun
