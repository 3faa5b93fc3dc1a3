#include "stats/routing_trace.h"

#include <charconv>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>

namespace xpack::stats {
namespace {

bool parse_u64(std::string_view s, uint64_t* out) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

Result<std::vector<TraceRecord>> parse_routing_trace(const std::string& text) {
  std::vector<TraceRecord> out;
  std::string_view rest(text);
  uint64_t line_no = 0;
  bool header_seen = false;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (!header_seen) {
      if (line != kTraceHeader)
        return err(XPACK_E_FORMAT, "trace line 1: expected header '{}'", kTraceHeader);
      header_seen = true;
      continue;
    }
    uint64_t v[3];
    size_t field = 0;
    while (true) {
      size_t comma = line.find(',');
      std::string_view f = line.substr(0, comma);
      if (field >= 3 || !parse_u64(f, &v[field]))
        return err(XPACK_E_FORMAT, "trace line {}: expected step,layer,expert", line_no);
      ++field;
      if (comma == std::string_view::npos) break;
      line = line.substr(comma + 1);
    }
    if (field != 3)
      return err(XPACK_E_FORMAT, "trace line {}: expected 3 fields, got {}", line_no, field);
    if (v[1] > UINT32_MAX || v[2] > UINT32_MAX)
      return err(XPACK_E_LIMIT, "trace line {}: layer or expert out of range", line_no);
    out.push_back({v[0], uint32_t(v[1]), uint32_t(v[2])});
  }
  if (!header_seen) return err(XPACK_E_FORMAT, "trace is empty (no header '{}')", kTraceHeader);
  return out;
}

Result<std::vector<TraceRecord>> read_routing_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_error("open trace {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_routing_trace(ss.str());
}

Result<std::unique_ptr<RoutingTraceWriter>> RoutingTraceWriter::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return errno_error("create trace {}", path);
  if (std::fprintf(f, "%s\n", kTraceHeader) < 0) {
    std::fclose(f);
    return errno_error("write trace {}", path);
  }
  return std::unique_ptr<RoutingTraceWriter>(new RoutingTraceWriter(f, path));
}

RoutingTraceWriter::~RoutingTraceWriter() {
  if (f_) std::fclose(f_);
}

Status RoutingTraceWriter::write(uint64_t step, uint32_t layer, const uint32_t* experts,
                                 size_t n) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < n; ++i)
    if (std::fprintf(f_, "%llu,%u,%u\n", (unsigned long long)step, layer, experts[i]) < 0)
      return errno_error("write trace {}", path_);
  return {};
}

Status RoutingTraceWriter::flush() {
  std::lock_guard lk(mu_);
  if (std::fflush(f_) != 0) return errno_error("flush trace {}", path_);
  return {};
}

}  // namespace xpack::stats
