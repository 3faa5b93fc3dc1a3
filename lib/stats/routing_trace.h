// The routing trace: CSV `step,layer,expert` with a header line, one line per
// routed expert per token, in the order the runtime requested them. The runtime
// writes it; xpack-sim reads it to replay the requests against other policies.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"

namespace xpack::stats {

struct TraceRecord {
  uint64_t step = 0;
  uint32_t layer = 0;
  uint32_t expert = 0;
};

inline constexpr const char* kTraceHeader = "step,layer,expert";

// Parses a whole trace. Fails with XPACK_E_FORMAT (naming the line) on a missing
// header, a malformed or out-of-range number or a wrong field count.
Result<std::vector<TraceRecord>> parse_routing_trace(const std::string& text);
Result<std::vector<TraceRecord>> read_routing_trace(const std::string& path);

// Appends records to a trace file. Thread-safe (one internal lock per write call).
class RoutingTraceWriter {
 public:
  static Result<std::unique_ptr<RoutingTraceWriter>> open(const std::string& path);
  ~RoutingTraceWriter();
  // One line per expert id of one token's routing at (step, layer).
  Status write(uint64_t step, uint32_t layer, const uint32_t* experts, size_t n);
  Status flush();

 private:
  explicit RoutingTraceWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::mutex mu_;
  std::FILE* f_;
  std::string path_;
};

}  // namespace xpack::stats
