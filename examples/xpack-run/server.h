// xpack-run --server: the loaded model behind an OpenAI-compatible HTTP API
// (doc/xpack-run.md, "Server"). Built only where cpp-httplib was found at
// configure time; otherwise run_server says so.
#pragma once

#include <cstdint>
#include <string>

#include "cli.h"
#include "experts.h"
#include "model.h"
#include "text.h"
#include "weights.h"

namespace xrun {

struct ServerRun {
  Model& model;
  TextCodec& codec;
  const Weights& weights;
  const CliOptions& options;
  ExpertSource* experts;  // may be null
  int64_t n_ctx;          // 0 = the model does not say
  int32_t eos;            // -1 = none
};

// Serves until the process is stopped; the exit status (1 when the address
// cannot be bound or the build has no server).
int run_server(const ServerRun& run);

// Empty where this build has the server; else why not, checked before a model
// is loaded so nobody waits for a large model to hear it.
std::string server_unavailable();

}  // namespace xrun
