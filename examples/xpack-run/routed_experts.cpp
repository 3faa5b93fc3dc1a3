#include "routed_experts.h"

#include <map>
#include <vector>

#include "xpack/xpack.h"

namespace xrun {

void run_routed_experts(Backend& be, ExpertSource& source, int layer, const Tensor& x, const Routing& routing,
                        const ExpertFfn& ffn, bool accumulate, const Tensor& out) {
  const int64_t n = x.rows(), k = routing.ids.width(), d = out.width();
  if (routing.ids.rows() != n || out.rows() != n || routing.weights.numel() != n * k) {
    throw ModelError("routed experts of layer " + std::to_string(layer) + ": routing and batch disagree");
  }
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  be.download(routing.ids, ids.data());

  // The picks (t * k + j) of each expert, experts in ascending id order; the
  // request lists them in that order, and a routing trace records it.
  std::map<int32_t, std::vector<int32_t>> picks_of;
  for (int64_t p = 0; p < n * k; ++p) picks_of[ids[size_t(p)]].push_back(static_cast<int32_t>(p));
  std::vector<int32_t> experts, tokens, picks;
  std::vector<int64_t> first;  // experts[i]'s picks are picks[first[i] .. first[i+1])
  for (const auto& [e, ps] : picks_of) {
    experts.push_back(e);
    first.push_back(static_cast<int64_t>(picks.size()));
    for (int32_t p : ps) {
      picks.push_back(p);
      tokens.push_back(static_cast<int32_t>(p / k));
    }
  }
  first.push_back(static_cast<int64_t>(picks.size()));
  const int n_experts = static_cast<int>(experts.size());
  const Tensor tokens_t = be.upload(XPACK_TYPE_I32, tokens.data(), 1, static_cast<int64_t>(tokens.size()));
  const Tensor picks_t = be.upload(XPACK_TYPE_I32, picks.data(), 1, static_cast<int64_t>(picks.size()));
  const Tensor per_pick = be.alloc(XPACK_TYPE_F32, d, n * k);

  std::unique_ptr<ExpertRequest> request = source.acquire(layer, experts.data(), n_experts, be.stream());
  std::vector<int> order;
  for (int i = 0; i < n_experts; ++i)
    if (request->resident(i)) order.push_back(i);
  for (int i = 0; i < n_experts; ++i)
    if (!request->resident(i)) order.push_back(i);
  for (int i : order) {
    const ExpertReady ready = request->get(i);
    be.wait_event(ready.ready_event);
    const int64_t m = first[size_t(i) + 1] - first[size_t(i)];
    const Tensor xs = be.alloc(XPACK_TYPE_F32, x.width(), m);
    be.get_rows(x, tokens_t.row_range(first[size_t(i)], m), xs);
    const Tensor ys = be.alloc(XPACK_TYPE_F32, d, m);
    ffn(*ready.weights, xs, ys);
    be.scatter_weighted(ys, picks_t.row_range(first[size_t(i)], m), routing.weights, per_pick);
    request->release(i);
  }
  request.reset();
  be.sum_picks(per_pick, k, accumulate, out);
}

}  // namespace xrun
