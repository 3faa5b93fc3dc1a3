#include "server_metrics.h"

#include <cstdio>
#include <set>
#include <sstream>
#include <vector>

namespace xrun {

namespace {

// Counters of the expert sources that only grow; the rest are gauges.
const std::set<std::string> kCumulative = {
    "cache_hits", "cache_misses", "cache_evictions", "pack_reads", "pack_read_bytes", "h2d_bytes",
    "fallback_count", "io_errors", "acquires", "steps", "stall_ns", "trace_write_errors", "read_ns",
    "acquire_calls", "experts_served"};

std::string number(double v) {
  char buf[64];
  // Counts as integers (exact below 2^53), times and speeds to 9 digits.
  if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 9007199254740992.0 && v > -9007199254740992.0)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Prometheus names: [a-zA-Z_:][a-zA-Z0-9_:]*.
std::string metric_name(const std::string& key) {
  std::string out;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out += ok ? c : '_';
  }
  return out;
}

std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void family(std::ostringstream& o, const std::string& name, const char* type, const std::string& help) {
  o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

void sample(std::ostringstream& o, const std::string& name, double v, const std::string& labels = "") {
  o << name << (labels.empty() ? "" : "{" + labels + "}") << ' ' << number(v) << '\n';
}

// One family per counter name, every tier's value under it.
struct EngineFamily {
  bool cumulative = false;
  std::vector<std::pair<std::string, double>> samples;  // labels, value
};

void collect(const nlohmann::ordered_json& obj, const std::string& labels, std::map<std::string, EngineFamily>& fams,
             std::vector<std::string>& info) {
  for (const auto& [key, v] : obj.items()) {
    if (v.is_number()) {
      EngineFamily& f = fams[metric_name(key)];
      f.cumulative = kCumulative.count(key) > 0;
      f.samples.emplace_back(labels, v.get<double>());
    } else if (v.is_string() && labels.empty()) {
      info.push_back(metric_name(key) + "=\"" + label_value(v.get<std::string>()) + "\"");
    } else if (v.is_object() && labels.empty()) {
      // {"tiers": {"gpu": {...}}}: each member object is one tier.
      for (const auto& [tier, counters] : v.items())
        if (counters.is_object()) collect(counters, "tier=\"" + label_value(tier) + "\"", fams, info);
    }
  }
}

}  // namespace

std::string prometheus_engine_counters(const nlohmann::ordered_json& counters) {
  std::map<std::string, EngineFamily> fams;
  std::vector<std::string> info;
  collect(counters, "", fams, info);
  std::ostringstream o;
  if (!info.empty()) {
    family(o, "xpack_engine_info", "gauge", "the expert source serving the routed experts");
    std::string labels;
    for (const std::string& l : info) labels += (labels.empty() ? "" : ",") + l;
    sample(o, "xpack_engine_info", 1, labels);
  }
  for (const auto& [name, f] : fams) {
    const std::string full = "xpack_engine_" + name + (f.cumulative ? "_total" : "");
    family(o, full, f.cumulative ? "counter" : "gauge", "expert source counter " + name + " (doc/xpack-run.md)");
    for (const auto& [labels, v] : f.samples) sample(o, full, v, labels);
  }
  return o.str();
}

void ServerMetrics::count_response(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(m_);
  ++responses_[{endpoint, status}];
}

void ServerMetrics::count_generation(const GenerationStats& s, bool cancelled) {
  std::lock_guard<std::mutex> lock(m_);
  ++generations_;
  if (cancelled) ++cancelled_;
  prompt_tokens_ += s.prompt_tokens;
  reused_tokens_ += s.reused_tokens;
  completion_tokens_ += s.completion_tokens;
  prefill_s_ += s.prefill_s;
  decode_s_ += s.decode_s;
  const size_t prefilled = s.prompt_tokens - s.reused_tokens;
  if (prefilled > 0 && s.prefill_s > 0) last_prefill_tok_s_ = double(prefilled) / s.prefill_s;
  if (s.completion_tokens > 0 && s.decode_s > 0) last_decode_tok_s_ = double(s.completion_tokens) / s.decode_s;
}

void ServerMetrics::set_engine_counters(nlohmann::ordered_json counters) {
  std::lock_guard<std::mutex> lock(m_);
  engine_ = std::move(counters);
}

std::string ServerMetrics::render(const RequestGate::Counts& gate) const {
  std::lock_guard<std::mutex> lock(m_);
  std::ostringstream o;
  family(o, "xpack_server_responses_total", "counter", "answers of the completion endpoints by HTTP status");
  for (const auto& [k, n] : responses_)
    sample(o, "xpack_server_responses_total", double(n),
           "endpoint=\"" + label_value(k.first) + "\",code=\"" + std::to_string(k.second) + "\"");
  family(o, "xpack_server_generations_total", "counter", "generations run on the model");
  sample(o, "xpack_server_generations_total", double(generations_));
  family(o, "xpack_server_cancelled_total", "counter", "generations ended early because the client went away");
  sample(o, "xpack_server_cancelled_total", double(cancelled_));
  family(o, "xpack_server_rejected_total", "counter", "requests answered 503 because the queue was full");
  sample(o, "xpack_server_rejected_total", double(gate.rejected));
  family(o, "xpack_server_queue_waiting", "gauge", "requests waiting for the model");
  sample(o, "xpack_server_queue_waiting", double(gate.waiting));
  family(o, "xpack_server_busy", "gauge", "1 while a generation runs");
  sample(o, "xpack_server_busy", gate.running ? 1 : 0);
  family(o, "xpack_server_prompt_tokens_total", "counter", "prompt tokens of the generations run");
  sample(o, "xpack_server_prompt_tokens_total", double(prompt_tokens_));
  family(o, "xpack_server_prompt_tokens_reused_total", "counter",
         "prompt tokens the model state already held from the previous request (not evaluated again)");
  sample(o, "xpack_server_prompt_tokens_reused_total", double(reused_tokens_));
  family(o, "xpack_server_completion_tokens_total", "counter", "tokens generated");
  sample(o, "xpack_server_completion_tokens_total", double(completion_tokens_));
  family(o, "xpack_server_prefill_seconds_total", "counter", "time spent evaluating prompts");
  sample(o, "xpack_server_prefill_seconds_total", prefill_s_);
  family(o, "xpack_server_decode_seconds_total", "counter", "time spent generating tokens");
  sample(o, "xpack_server_decode_seconds_total", decode_s_);
  family(o, "xpack_server_prefill_tokens_per_second", "gauge", "prompt evaluation speed of the last generation");
  sample(o, "xpack_server_prefill_tokens_per_second", last_prefill_tok_s_);
  family(o, "xpack_server_decode_tokens_per_second", "gauge", "generation speed of the last generation");
  sample(o, "xpack_server_decode_tokens_per_second", last_decode_tok_s_);
  return o.str() + prometheus_engine_counters(engine_);
}

}  // namespace xrun
