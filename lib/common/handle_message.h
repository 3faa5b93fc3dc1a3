// The per-handle error message behind every xpack_X_errmsg(h): one message per
// calling thread, so concurrent failing calls on one handle (which the header
// allows for the functions it calls thread-safe) neither race on one string nor
// hand a thread another thread's message, and the pointer errmsg returns stays
// valid until that thread's next failing call on the handle.
#pragma once
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace xpack {

class HandleMessage {
 public:
  HandleMessage() = default;
  HandleMessage(const HandleMessage&) = delete;
  HandleMessage& operator=(const HandleMessage&) = delete;

  // Records msg as the calling thread's message on this handle.
  void set(std::string msg) const;
  // The calling thread's most recent message on this handle ("" if none).
  const char* get() const;

 private:
  mutable std::mutex mu_;
  // Node-based: a thread's string stays where it is while other threads insert
  // theirs, and only its own thread writes it. One entry per thread that ever
  // failed on the handle (thread ids are reused, so it does not grow without
  // bound with short-lived threads).
  mutable std::unordered_map<std::thread::id, std::string> by_thread_;
};

// Sets xpack_last_error() and, when h is not NULL, the calling thread's message
// on that handle; returns code. The one way the C API records a failure.
int record_failure(const HandleMessage* h, int code, std::string msg);

}  // namespace xpack
