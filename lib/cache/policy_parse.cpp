#include "cache/policy.h"

namespace xpack::cache {

Result<PolicyKind> parse_policy(std::string_view name) {
  if (name == "lru") return PolicyKind::kLru;
  if (name == "lfu") return PolicyKind::kLfu;
  if (name == "hybrid" || name == "reuse-lfu-lru-v2") return PolicyKind::kHybrid;
  if (name == "belady" || name == "min") return PolicyKind::kBelady;
  if (name == "decay" || name == "lrfu") return PolicyKind::kDecay;
  if (name == "adaptive") return PolicyKind::kAdaptive;
  if (name == "oracle-lfu") return PolicyKind::kOracleLfu;
  return err(XPACK_E_INVALID_ARG,
             "unknown cache policy '{}' (lru, lfu, hybrid, belady, decay, adaptive, oracle-lfu)", name);
}

const char* policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru: return "lru";
    case PolicyKind::kLfu: return "lfu";
    case PolicyKind::kHybrid: return "hybrid";
    case PolicyKind::kBelady: return "belady";
    case PolicyKind::kDecay: return "decay";
    case PolicyKind::kAdaptive: return "adaptive";
    case PolicyKind::kOracleLfu: return "oracle-lfu";
  }
  return "?";
}

}  // namespace xpack::cache

namespace xpack::cache {

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru: return make_lru_policy();
    case PolicyKind::kLfu: return make_lfu_policy();
    case PolicyKind::kHybrid: return make_hybrid_policy();
    case PolicyKind::kBelady: return make_belady_policy();
    case PolicyKind::kDecay: return make_decay_policy();
    case PolicyKind::kAdaptive: return make_adaptive_policy();
    case PolicyKind::kOracleLfu: return make_oracle_lfu_policy();
  }
  return nullptr;
}

}  // namespace xpack::cache
