// xpack-sim: replays a routing trace (CSV step,layer,expert) against one expert
// cache of N slots shared by all layers, once per eviction policy, and reports
// hits, misses and hit rate per layer and in total. Belady's MIN is the offline
// upper bound: the gap between it and the online policies is what a better
// policy could still gain on this trace. The oracle LFU (the keys the whole trace
// requests most kept) is the second reference: were requests independent draws from
// fixed popularities, no policy without lookahead would do better, so it estimates
// how much of that gap is left to prefetch (knowing the next requests).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/replay.h"
#include "cli_app.h"
#include "stats/routing_trace.h"

namespace {

const char kAbout[] =
    "Replays the trace in file order against one cache of N slots keyed by (layer, expert).\n"
    "The experts of one (step, layer) are requested together and stay protected until\n"
    "that group ends; hits and misses count distinct experts per group (as the runtime).\n"
    "A group of more than K lines (K = --top-k, default the smallest group) is a prefill\n"
    "request. A group wider than the cache streams its excess experts without keeping\n"
    "them (counted as misses and as 'bypassed').\n"
    "With --host-capacity F, a host-RAM tier of F frames sits behind the slots as in the\n"
    "cache (host_cache_bytes): each eviction is demoted into it, a miss it holds is a\n"
    "host hit (a copy, no read), its oldest demotion goes first, and one frame is kept\n"
    "spare for swaps, so it holds F - 1 experts.\n"
    "A prefill request evicts keys no decode step has used first, as the cache does (its\n"
    "decode working set survives a prompt); --no-decode-protection replays without it.";

}  // namespace

int main(int argc, char** argv) {
  using namespace xpack;
  std::string trace_path;
  uint64_t capacity = 0;
  uint32_t top_k = 0;
  uint64_t host_capacity = 0;
  std::string policies = "adaptive,lru,lfu,hybrid,decay,oracle-lfu,belady";
  bool json = false;
  bool no_decode_protection = false;
  cli::App app("xpack-sim", "xpack-sim --trace T.csv --capacity N\n"
                            "                 [--policy adaptive,lru,lfu,hybrid,decay,oracle-lfu,belady]\n"
                            "                 [--top-k K] [--host-capacity F] [--no-decode-protection] [--json]",
               kAbout, "exit status: 0 success, 1 unreadable trace or failed replay, 2 usage error");
  app.text("--trace", "PATH", &trace_path, "routing trace CSV with header 'step,layer,expert'")->required();
  app.count("--capacity", "N", &capacity, "cache slots (whole experts)", 1, UINT64_MAX)->required();
  app.text("--policy", "LIST", &policies,
           "comma-separated policies (default adaptive,lru,lfu,hybrid,decay,oracle-lfu,belady;\n"
           "oracle-lfu and belady know the whole trace: references, not policies the cache runs)");
  app.count("--top-k", "K", &top_k, "routed experts per token (default: inferred)", 1, UINT32_MAX);
  app.count("--host-capacity", "F",  &host_capacity,
                             "host tier frames behind the slots, one spare (default 0 = none; else >= 2)", 0,
                             UINT32_MAX);
  app.flag("--no-decode-protection", &no_decode_protection,
           "a prefill takes the policy's victim as decode does, decode's experts\n"
           "included (what the protection is worth)");
  app.flag("--json", &json,
           "print {\"policies\": {\"<name>\": {\"hits\", \"misses\", \"hit_rate\",\n"
           "\"of_belady\" (with belady listed), \"per_layer\": [...]}}} instead of a table");
  if (auto rc = app.parse(argc, argv)) return *rc;
  if (host_capacity == 1)
    return app.usage_error("--host-capacity 1 holds nothing (one frame is the spare); give 0 or at least 2");

  std::vector<cache::PolicyKind> kinds;
  for (size_t pos = 0; pos <= policies.size();) {
    size_t comma = policies.find(',', pos);
    if (comma == std::string::npos) comma = policies.size();
    auto k = cache::parse_policy(std::string_view(policies).substr(pos, comma - pos));
    if (!k.ok()) return app.usage_error("--policy: " + k.error().message);
    kinds.push_back(*k);
    pos = comma + 1;
  }

  auto trace = stats::read_routing_trace(trace_path);
  if (!trace.ok()) return app.failure(trace.error().message);

  nlohmann::ordered_json out;
  out["trace"] = trace_path;
  out["capacity"] = capacity;
  if (host_capacity) out["host_capacity"] = host_capacity;
  out["decode_protection"] = !no_decode_protection;
  out["policies"] = nlohmann::ordered_json::object();
  std::vector<cache::ReplayResult> results;
  for (auto kind : kinds) {
    cache::ReplayOptions o;
    o.capacity = capacity;
    o.policy = kind;
    o.top_k = uint32_t(top_k);
    o.host_capacity = host_capacity;
    o.protect_decode = !no_decode_protection;
    auto r = cache::replay_trace(*trace, o);
    if (!r.ok()) return app.failure(r.error().message);
    results.push_back(*r);
  }
  // What each online policy reaches of the offline optimum, where it was replayed too.
  std::optional<uint64_t> belady_hits;
  for (size_t i = 0; i < kinds.size(); ++i)
    if (kinds[i] == cache::PolicyKind::kBelady) belady_hits = results[i].hits;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const auto kind = kinds[i];
    const cache::ReplayResult* r = &results[i];
    const char* name = cache::policy_name(kind);
    const double of_belady = belady_hits && *belady_hits ? double(r->hits) / double(*belady_hits) : 0.0;
    if (json) {
      nlohmann::ordered_json p;
      p["hits"] = r->hits;
      p["misses"] = r->misses;
      p["hit_rate"] = r->hit_rate();
      if (belady_hits) p["of_belady"] = of_belady;
      p["evictions"] = r->evictions;
      p["bypassed"] = r->bypassed;
      if (host_capacity) {
        p["host_hits"] = r->host_hits;
        p["host_demotions"] = r->host_demotions;
        p["host_evictions"] = r->host_evictions;
        p["hit_rate_with_host"] = r->hit_rate_with_host();
        p["reads"] = r->misses - r->host_hits;
      }
      auto layers = nlohmann::ordered_json::array();
      for (size_t l = 0; l < r->per_layer.size(); ++l) {
        const auto& c = r->per_layer[l];
        uint64_t n = c.hits + c.misses;
        layers.push_back({{"layer", l}, {"hits", c.hits}, {"misses", c.misses},
                          {"hit_rate", n ? double(c.hits) / double(n) : 0.0}});
      }
      p["per_layer"] = layers;
      out["policies"][name] = p;
    } else {
      std::printf("policy %-10s capacity %llu: hits %llu misses %llu hit rate %.4f ",
                  name, (unsigned long long)capacity, (unsigned long long)r->hits,
                  (unsigned long long)r->misses, r->hit_rate());
      if (belady_hits) std::printf("(%.3f of belady) ", of_belady);
      std::printf("(evictions %llu, bypassed %llu)\n", (unsigned long long)r->evictions,
                  (unsigned long long)r->bypassed);
      if (host_capacity)
        std::printf("  host tier %llu frames: host hits %llu, hit rate with host %.4f, reads %llu "
                    "(demotions %llu, host evictions %llu)\n",
                    (unsigned long long)host_capacity, (unsigned long long)r->host_hits, r->hit_rate_with_host(),
                    (unsigned long long)(r->misses - r->host_hits), (unsigned long long)r->host_demotions,
                    (unsigned long long)r->host_evictions);
      for (size_t l = 0; l < r->per_layer.size(); ++l) {
        const auto& c = r->per_layer[l];
        uint64_t n = c.hits + c.misses;
        if (n == 0) continue;
        std::printf("  layer %3zu: hits %llu misses %llu hit rate %.4f\n", l,
                    (unsigned long long)c.hits, (unsigned long long)c.misses,
                    double(c.hits) / double(n));
      }
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
