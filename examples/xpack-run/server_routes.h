// The HTTP face of the server, over cpp-httplib: the OpenAI routes, /health
// and /metrics, and an OpenAI error object for everything refused.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "sampling.h"
#include "server_engine.h"
#include "server_gate.h"
#include "server_metrics.h"

namespace httplib {
class Server;
}

namespace xrun {

// What every route shares. The engine is only touched by the request that
// holds the gate's turn.
struct ServerState {
  Engine& engine;
  RequestGate& gate;
  ServerMetrics& metrics;
  std::string model_id;  // GET /v1/models; echoed where a request names none
  int64_t created = 0;   // Unix seconds the server started
  SamplingParams defaults;
  std::atomic<uint64_t> next_id{0};
};

// Largest request body accepted (413 beyond): far above any prompt a context holds.
constexpr size_t kMaxBodyBytes = size_t{8} << 20;

void add_routes(httplib::Server& server, ServerState& state);

}  // namespace xrun
