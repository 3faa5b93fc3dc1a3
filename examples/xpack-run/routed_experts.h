// The routed-experts dispatcher every MoE graph uses: gather each expert's
// tokens, run the expert's FFN on them as one batch, scatter the weighted
// results back, sum each token's picks in rank order.
//
// The router's expert ids reach the host once per MoE layer (one small
// download): the only synchronisation between host and compute stream in a
// layer, and none where the host knows the ids already (Routing::host_ids). The layer's distinct experts are then acquired in one request; the
// resident ones are computed first, as one group, while the others are still
// loading; each missed expert follows as its own group once loaded. A group is
// one gather, grouped products (Backend::grouped_matmul: one launch for all
// its decode-sized experts on a GPU; a decode-sized group's gate and up share
// one launch, its rows gathered twice), one activation and one scatter, so a
// decode step that hits costs the same few launches for top-8 as for top-1.
// Each group's work waits on its experts' ready events, and each expert is
// released on the compute stream as soon as its work is enqueued, so a layer
// wider than the cache streams through it. Because every (token, rank) pick is
// written to its own row, each expert's rows equal its product alone, and the
// picks are summed in rank order afterwards, the result does not depend on
// which experts were resident: streamed == resident, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend.h"
#include "experts.h"
#include "gated_ffn.h"
#include "next_layer_guess.h"

namespace xrun {

// A batch's routing: per token its k experts, best first, and their weights.
struct Routing {
  Tensor ids;      // I32 [n][k]
  Tensor weights;  // F32 [n][k]
  // Next-layer prefetch (next_layer_guess.h), else empty: the guessed experts
  // [n][width] of layer guess_layer, in one allocation with ids (`id_block`:
  // ids, then guess), so that one download brings both to the host.
  Tensor guess{};
  int guess_layer = -1;
  Tensor id_block{};
  // ids [n][k] as the host already knows them (hash routing: a table of the
  // token ids), else empty. Without a guess to bring back, the dispatcher then
  // skips the download and its wait: the layer's experts are requested while
  // the GPU is still behind, and the stream runs on without a gap.
  std::vector<int32_t> host_ids{};
};

// A routing for n tokens of k experts with room for a guess `guess_width`
// wide (0: none). ids and guess view id_block; weights is its own.
Routing make_routing(Backend& be, int64_t n, int64_t k, int64_t guess_width);

// The routed experts' gated FFN, as the model defines it: each expert's
// matrices (checked: a missing or misshapen role throws ModelError naming the
// expert) and the gate activation, which is elementwise, so it runs once over
// a whole group's rows.
struct ExpertFfn {
  std::function<GatedMatrices(const ExpertWeights& w)> matrices;
  GateActivation act;
};

// out [n][d] = sum over j of weights[t][j] * ffn_{ids[t][j]}(x[t]) (plus out
// itself with `accumulate`). Every picked expert is computed. With a guesser,
// a guess made for this layer is scored against its routing, and the one
// routing.guess carries is handed to the source after this layer's acquire.
// `meanwhile` (if given) enqueues work that does not need the routing (a
// shared expert) between the start of the ids' download and the host's wait for
// it, so that the GPU computes it while the host reads the ids and acquires the
// experts; it is enqueued before any routed expert, so `accumulate` adds onto
// what it wrote to out.
void run_routed_experts(Backend& be, ExpertSource& source, int layer, const Tensor& x, const Routing& routing,
                        const ExpertFfn& ffn, bool accumulate, const Tensor& out,
                        NextLayerGuesser* guesser = nullptr, const std::function<void()>& meanwhile = {});

}  // namespace xrun
