// What GET /metrics reports, in Prometheus' text format: the server's request
// and token counters, the speeds of the last generation, the queue, and the
// expert source's counters as of the end of the last generation (the sources
// count in plain integers while they run, so they are copied between runs).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "server_engine.h"
#include "server_gate.h"

namespace xrun {

class ServerMetrics {
 public:
  // Every answer of a generation endpoint, by endpoint and HTTP status.
  void count_response(const std::string& endpoint, int status);
  // A generation that ran (cancelled: the client went away before its end).
  void count_generation(const GenerationStats& s, bool cancelled);
  void set_engine_counters(nlohmann::ordered_json counters);
  // The whole page. Thread-safe, like every method here.
  std::string render(const RequestGate::Counts& gate) const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;
  uint64_t generations_ = 0, cancelled_ = 0;
  uint64_t prompt_tokens_ = 0, reused_tokens_ = 0, completion_tokens_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
  double last_prefill_tok_s_ = 0, last_decode_tok_s_ = 0;
  nlohmann::ordered_json engine_ = nlohmann::ordered_json::object();
};

// The expert source's counters (counters_json) as Prometheus lines: numbers as
// xpack_engine_NAME (cumulative ones as counters named ..._total), the source
// as a label of xpack_engine_info, and an object of per-tier objects
// ({"tiers": {"gpu": {...}, "host": {...}}}) as xpack_engine_NAME{tier="gpu"}.
std::string prometheus_engine_counters(const nlohmann::ordered_json& counters);

}  // namespace xrun
