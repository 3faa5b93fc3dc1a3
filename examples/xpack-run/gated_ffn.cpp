#include "gated_ffn.h"

#include "xpack/xpack.h"

namespace xrun {

void gated_ffn(Backend& be, const GatedMatrices& m, const GateActivation& act, const Tensor& x, const Tensor& y) {
  const int64_t d_ff = m.gate.rows(), n = x.rows();
  const Tensor g = be.empty(XPACK_TYPE_F32, d_ff, n);
  const Tensor u = be.empty(XPACK_TYPE_F32, d_ff, n);
  be.shared_input_matmul(x, {{&m.gate, &g}, {&m.up, &u}});
  gated_ffn_down(be, m, act, g, u, y);
}

void gated_ffn_down(Backend& be, const GatedMatrices& m, const GateActivation& act, const Tensor& g, const Tensor& u,
                    const Tensor& y) {
  act(g, u);
  be.matmul(m.down, g, y);
}

GatedMatrices expert_matrices(const ExpertWeights& w, int64_t d_in, int64_t d_ff, int64_t d_out, const std::string& who) {
  GatedMatrices m;
  if (const Tensor* gu = w.role("gate_up")) {
    if (gu->width() != d_in || gu->rows() != 2 * d_ff) throw ModelError(who + ": gate_up has the wrong shape");
    // Each output is one weight row, so the halves are row ranges of the fused matrix.
    m.gate = gu->row_range(0, d_ff);
    m.up = gu->row_range(d_ff, d_ff);
  } else {
    const Tensor* g = w.role("gate");
    const Tensor* u = w.role("up");
    if (!g || !u) throw ModelError(who + ": missing gate/up weights");
    m.gate = *g;
    m.up = *u;
  }
  const Tensor* dn = w.role("down");
  if (!dn) throw ModelError(who + ": missing down weights");
  m.down = *dn;
  if (m.gate.width() != d_in || m.gate.rows() != d_ff || m.up.width() != d_in || m.up.rows() != d_ff ||
      m.down.width() != d_ff || m.down.rows() != d_out) {
    throw ModelError(who + ": expert matrices do not match " + std::to_string(d_in) + " x " + std::to_string(d_ff) +
                     " -> " + std::to_string(d_out));
  }
  return m;
}

}  // namespace xrun
