// xpack-sim: replays a routing trace (CSV step,layer,expert) against one expert
// cache of N slots shared by all layers, once per eviction policy, and reports
// hits, misses and hit rate per layer and in total. Belady's MIN is the offline
// upper bound: the gap between it and the online policies is what a better
// policy could still gain on this trace.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/replay.h"
#include "stats/routing_trace.h"

namespace {

void usage(std::FILE* f) {
  std::fprintf(f,
      "usage: xpack-sim --trace T.csv --capacity N [--policy lru,lfu,hybrid,belady]\n"
      "                 [--top-k K] [--json]\n"
      "\n"
      "Replays the trace in file order against one cache of N slots keyed by (layer, expert).\n"
      "The experts of one (step, layer) are requested together and stay protected until\n"
      "that group ends; hits and misses count distinct experts per group (as the runtime).\n"
      "A group of more than K lines (K = --top-k, default the smallest group) is a prefill\n"
      "request. A group wider than the cache streams its excess experts without keeping\n"
      "them (counted as misses and as 'bypassed').\n"
      "\n"
      "  --trace PATH     routing trace CSV with header 'step,layer,expert'\n"
      "  --capacity N     cache slots (whole experts)\n"
      "  --policy LIST    comma-separated policies (default lru,lfu,hybrid,belady)\n"
      "  --top-k K        routed experts per token (default: inferred)\n"
      "  --json           print {\"policies\": {\"<name>\": {\"hits\", \"misses\", \"hit_rate\",\n"
      "                   \"per_layer\": [...]}}} instead of a table\n"
      "  --help           this text\n");
}

bool parse_uint(const char* s, uint64_t* out) {
  char* end = nullptr;
  if (!s || !*s || *s == '-') return false;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace xpack;
  std::string trace_path;
  uint64_t capacity = 0, top_k = 0;
  std::string policies = "lru,lfu,hybrid,belady";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--trace") {
      const char* v = value();
      if (!v) { usage(stderr); return 2; }
      trace_path = v;
    } else if (a == "--capacity") {
      if (!parse_uint(value(), &capacity) || capacity == 0) {
        std::fprintf(stderr, "xpack-sim: --capacity needs a positive integer\n");
        return 2;
      }
    } else if (a == "--top-k") {
      if (!parse_uint(value(), &top_k) || top_k == 0 || top_k > UINT32_MAX) {
        std::fprintf(stderr, "xpack-sim: --top-k needs a positive integer\n");
        return 2;
      }
    } else if (a == "--policy") {
      const char* v = value();
      if (!v) { usage(stderr); return 2; }
      policies = v;
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "xpack-sim: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (trace_path.empty() || capacity == 0) {
    usage(stderr);
    return 2;
  }

  std::vector<cache::PolicyKind> kinds;
  for (size_t pos = 0; pos <= policies.size();) {
    size_t comma = policies.find(',', pos);
    if (comma == std::string::npos) comma = policies.size();
    auto k = cache::parse_policy(std::string_view(policies).substr(pos, comma - pos));
    if (!k.ok()) {
      std::fprintf(stderr, "xpack-sim: %s\n", k.error().message.c_str());
      return 2;
    }
    kinds.push_back(*k);
    pos = comma + 1;
  }

  auto trace = stats::read_routing_trace(trace_path);
  if (!trace.ok()) {
    std::fprintf(stderr, "xpack-sim: %s\n", trace.error().message.c_str());
    return 1;
  }

  nlohmann::ordered_json out;
  out["trace"] = trace_path;
  out["capacity"] = capacity;
  out["policies"] = nlohmann::ordered_json::object();
  for (auto kind : kinds) {
    cache::ReplayOptions o;
    o.capacity = capacity;
    o.policy = kind;
    o.top_k = uint32_t(top_k);
    auto r = cache::replay_trace(*trace, o);
    if (!r.ok()) {
      std::fprintf(stderr, "xpack-sim: %s\n", r.error().message.c_str());
      return 1;
    }
    const char* name = cache::policy_name(kind);
    if (json) {
      nlohmann::ordered_json p;
      p["hits"] = r->hits;
      p["misses"] = r->misses;
      p["hit_rate"] = r->hit_rate();
      p["evictions"] = r->evictions;
      p["bypassed"] = r->bypassed;
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
      std::printf("policy %-7s capacity %llu: hits %llu misses %llu hit rate %.4f "
                  "(evictions %llu, bypassed %llu)\n",
                  name, (unsigned long long)capacity, (unsigned long long)r->hits,
                  (unsigned long long)r->misses, r->hit_rate(),
                  (unsigned long long)r->evictions, (unsigned long long)r->bypassed);
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
