// The gated feed-forward y = down · act(gate · x, up · x), written once for
// dense FFNs, shared experts and routed experts (whose fused gate_up matrix is
// split into its two halves, the gate first).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend.h"
#include "experts.h"

namespace xrun {

struct GatedMatrices {
  Tensor gate, up, down;  // gate, up: [d_ff][d_in]; down: [d_out][d_ff]
};

// act(g, u) writes its result into g.
using GateActivation = std::function<void(const Tensor& g, const Tensor& u)>;

// y [n][d_out] from x [n][d_in].
void gated_ffn(Backend& be, const GatedMatrices& m, const GateActivation& act, const Tensor& x, const Tensor& y);

// Its second half, for a caller that made g = gate · x and u = up · x together
// with other products of x (Backend::shared_input_matmul): y = down · act(g, u);
// g is overwritten.
void gated_ffn_down(Backend& be, const GatedMatrices& m, const GateActivation& act, const Tensor& g, const Tensor& u,
                    const Tensor& y);

// An expert's matrices, checked against d_in x d_ff -> d_out; `who` names the
// expert in the ModelError thrown when a role is missing or misshapen.
GatedMatrices expert_matrices(const ExpertWeights& w, int64_t d_in, int64_t d_ff, int64_t d_out, const std::string& who);

}  // namespace xrun
