#include "cuda_op_profile.h"

#include <algorithm>
#include <cstdio>

namespace xrun {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

OpProfile::~OpProfile() {
  cudaStreamSynchronize(stream_);
  for (const Pending& p : pending_) {
    cudaEventDestroy(p.begin);
    cudaEventDestroy(p.end);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
}

cudaEvent_t OpProfile::take_event() {
  if (free_events_.empty()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    return e;
  }
  cudaEvent_t e = free_events_.back();
  free_events_.pop_back();
  return e;
}

OpProfile::Section& OpProfile::current() {
  if (sections_.empty()) sections_.push_back({"load", {}, 0});
  return sections_.back();
}

OpProfile::Scope::Scope(OpProfile* p, const char* name, std::string detail) : p_(p) {
  if (!p_) return;
  if (p_->depth_++ > 0) {  // counted in the enclosing operation
    p_ = nullptr;
    p->depth_--;
    return;
  }
  key_ = detail.empty() ? std::string(name) : std::string(name) + " " + detail;
  t0_ = std::chrono::steady_clock::now();
  begin_ = p_->take_event();
  if (begin_) cudaEventRecord(begin_, p_->stream_);
}

OpProfile::Scope::~Scope() {
  if (!p_) return;
  p_->depth_--;
  cudaEvent_t end = p_->take_event();
  if (end) cudaEventRecord(end, p_->stream_);
  Totals& t = p_->current().ops[key_];
  t.calls++;
  t.host_ms += ms_since(t0_);
  if (begin_ && end) {
    p_->pending_.push_back({std::move(key_), begin_, end});
  } else {  // no event to time it with: its GPU time is missing (never seen so far)
    if (begin_) p_->free_events_.push_back(begin_);
    if (end) p_->free_events_.push_back(end);
  }
}

void OpProfile::collect() {
  Section& s = current();
  for (Pending& p : pending_) {
    float ms = 0;
    if (cudaEventSynchronize(p.end) == cudaSuccess && cudaEventElapsedTime(&ms, p.begin, p.end) == cudaSuccess) {
      s.ops[p.key].gpu_ms += ms;
    }
    free_events_.push_back(p.begin);
    free_events_.push_back(p.end);
  }
  pending_.clear();
}

void OpProfile::section(const std::string& name) {
  cudaStreamSynchronize(stream_);
  collect();
  current().wall_ms += ms_since(section_start_);
  sections_.push_back({name, {}, 0});
  section_start_ = std::chrono::steady_clock::now();
}

std::string OpProfile::report() {
  if (!ended_) {
    cudaStreamSynchronize(stream_);
    collect();
    current().wall_ms += ms_since(section_start_);
    ended_ = true;
  }
  std::string out;
  char line[512];
  for (const Section& s : sections_) {
    if (s.ops.empty()) continue;
    double gpu = 0, host = 0;
    int64_t calls = 0;
    for (const auto& [k, t] : s.ops) {
      gpu += t.gpu_ms;
      host += t.host_ms;
      calls += t.calls;
    }
    const double wall = std::max(s.wall_ms, 1e-9);
    std::snprintf(line, sizeof line,
                  "xpack-run: --profile-ops %s: wall %.2f ms, %lld operations; their GPU time %.2f ms (%.0f %% of wall), "
                  "the host's time in them %.2f ms (%.0f %%; download() includes its wait for the GPU)\n",
                  s.name.c_str(), s.wall_ms, static_cast<long long>(calls), gpu, 100.0 * gpu / wall, host,
                  100.0 * host / wall);
    out += line;
    std::vector<std::pair<std::string, Totals>> rows(s.ops.begin(), s.ops.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.gpu_ms > b.second.gpu_ms; });
    std::snprintf(line, sizeof line, "  %-52s %8s %10s %9s %10s %9s\n", "operation", "calls", "GPU ms", "GPU us/op",
                  "host ms", "host us/op");
    out += line;
    for (const auto& [k, t] : rows) {
      const double n = static_cast<double>(std::max<int64_t>(t.calls, 1));
      std::snprintf(line, sizeof line, "  %-52s %8lld %10.3f %9.1f %10.3f %9.1f\n", k.c_str(),
                    static_cast<long long>(t.calls), t.gpu_ms, 1e3 * t.gpu_ms / n, t.host_ms, 1e3 * t.host_ms / n);
      out += line;
    }
  }
  out += "xpack-run: --profile-ops: two events per operation slow the host; GPU time per operation spans its first to last event\n";
  return out;
}

}  // namespace xrun
