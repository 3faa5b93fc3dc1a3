// Admission to the model: one generation runs at a time (the model holds one
// sequence's state), the others wait in arrival order in a bounded queue, and a
// request that finds the queue full is turned away (the server answers 503)
// rather than piling up threads and memory.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

namespace xrun {

class RequestGate {
 public:
  // `max_waiting`: requests that may wait while one runs (0 = none).
  explicit RequestGate(size_t max_waiting) : max_waiting_(max_waiting) {}
  RequestGate(const RequestGate&) = delete;
  RequestGate& operator=(const RequestGate&) = delete;

  // A place in the queue. Destroying it gives the model to the next in line,
  // or leaves the queue when it never got its turn.
  class Turn {
   public:
    Turn(Turn&& o) noexcept : gate_(o.gate_), id_(o.id_), running_(o.running_) { o.gate_ = nullptr; }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    Turn& operator=(Turn&&) = delete;
    ~Turn();
    // Blocks until every request that came earlier is done; false when the gate
    // was closed meanwhile (the server is stopping).
    bool wait();

   private:
    friend class RequestGate;
    Turn(RequestGate* g, uint64_t id) : gate_(g), id_(id) {}
    RequestGate* gate_;
    uint64_t id_;
    bool running_ = false;
  };

  // nullopt when max_waiting requests already wait, or the gate is closed.
  std::optional<Turn> try_enter();
  // Wakes every waiter with false and refuses new ones.
  void close();

  struct Counts {
    size_t waiting = 0;
    bool running = false;
    uint64_t rejected = 0;
  };
  Counts counts() const;

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  const size_t max_waiting_;
  std::deque<uint64_t> queue_;  // ids not yet running, in arrival order
  uint64_t next_id_ = 0;
  bool running_ = false;
  bool closed_ = false;
  uint64_t rejected_ = 0;
};

}  // namespace xrun
