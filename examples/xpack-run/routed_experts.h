// The routed-experts dispatcher every MoE graph uses: gather each expert's
// tokens, run the expert's FFN on them as one batch, scatter the weighted
// results back, sum each token's picks in rank order.
//
// The router's expert ids reach the host once per MoE layer (one small
// download): the only synchronisation between host and compute stream in a
// layer. The layer's distinct experts are then acquired in one request; the
// resident ones are computed first while the others are still loading, each
// expert's work waits on that expert's ready event, and each expert is
// released on the compute stream as soon as its work is enqueued, so a layer
// wider than the cache streams through it. Because every (token, rank) pick is
// written to its own row and summed in rank order afterwards, the result does
// not depend on which experts were resident: streamed == resident, bit for bit.
#pragma once

#include <cstdint>
#include <functional>

#include "backend.h"
#include "experts.h"

namespace xrun {

// A batch's routing: per token its k experts, best first, and their weights.
struct Routing {
  Tensor ids;      // I32 [n][k]
  Tensor weights;  // F32 [n][k]
};

// One expert's FFN: y [m][out width] from x [m][in width], with its weights.
using ExpertFfn = std::function<void(const ExpertWeights& w, const Tensor& x, const Tensor& y)>;

// out [n][d] = sum over j of weights[t][j] * ffn_{ids[t][j]}(x[t]) (plus out
// itself with `accumulate`). Every picked expert is computed.
void run_routed_experts(Backend& be, ExpertSource& source, int layer, const Tensor& x, const Routing& routing,
                        const ExpertFfn& ffn, bool accumulate, const Tensor& out);

}  // namespace xrun
