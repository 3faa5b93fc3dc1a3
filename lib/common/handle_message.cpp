#include "common/handle_message.h"

#include "common/last_error.h"

namespace xpack {

void HandleMessage::set(std::string msg) const {
  std::lock_guard lk(mu_);
  by_thread_[std::this_thread::get_id()] = std::move(msg);
}

const char* HandleMessage::get() const {
  std::lock_guard lk(mu_);
  auto it = by_thread_.find(std::this_thread::get_id());
  return it == by_thread_.end() ? "" : it->second.c_str();
}

int record_failure(const HandleMessage* h, int code, std::string msg) {
  set_last_error(msg);
  if (h) h->set(std::move(msg));
  return code;
}

}  // namespace xpack
