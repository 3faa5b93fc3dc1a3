#include "server_gate.h"

#include <algorithm>

namespace xrun {

std::optional<RequestGate::Turn> RequestGate::try_enter() {
  std::lock_guard<std::mutex> lock(m_);
  // The request that would run at once does not count as waiting.
  const size_t waiting_after = queue_.size() + (running_ ? 1 : 0);
  if (closed_ || waiting_after > max_waiting_) {
    ++rejected_;
    return std::nullopt;
  }
  const uint64_t id = next_id_++;
  queue_.push_back(id);
  return Turn(this, id);
}

bool RequestGate::Turn::wait() {
  if (running_) return true;
  std::unique_lock<std::mutex> lock(gate_->m_);
  gate_->cv_.wait(lock, [&] { return gate_->closed_ || (!gate_->running_ && gate_->queue_.front() == id_); });
  if (gate_->closed_) return false;
  gate_->queue_.pop_front();
  gate_->running_ = true;
  running_ = true;
  return true;
}

RequestGate::Turn::~Turn() {
  if (!gate_) return;
  {
    std::lock_guard<std::mutex> lock(gate_->m_);
    if (running_) {
      gate_->running_ = false;
    } else {
      auto& q = gate_->queue_;
      q.erase(std::remove(q.begin(), q.end(), id_), q.end());
    }
  }
  // Every waiter checks whether it is now first: the queue is short (bounded).
  gate_->cv_.notify_all();
}

void RequestGate::close() {
  {
    std::lock_guard<std::mutex> lock(m_);
    closed_ = true;
  }
  cv_.notify_all();
}

RequestGate::Counts RequestGate::counts() const {
  std::lock_guard<std::mutex> lock(m_);
  return {queue_.size(), running_, rejected_};
}

}  // namespace xrun
