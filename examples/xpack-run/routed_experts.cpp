#include "routed_experts.h"

#include <map>
#include <vector>

#include "xpack/xpack.h"

namespace xrun {

Routing make_routing(Backend& be, int64_t n, int64_t k, int64_t guess_width) {
  Routing r;
  r.weights = be.empty(XPACK_TYPE_F32, k, n);
  if (guess_width <= 0) {
    r.ids = be.empty(XPACK_TYPE_I32, k, n);
    return r;
  }
  r.id_block = be.alloc(XPACK_TYPE_I32, 1, n * (k + guess_width));
  r.ids = r.id_block.row_range(0, n * k).reshaped(k, n);
  r.guess = r.id_block.row_range(n * k, n * guess_width).reshaped(guess_width, n);
  return r;
}

namespace {

// Decode-sized groups whose gate and up weights agree in type and shape take one
// grouped launch for both: a decode step's 6 (DeepSeek-V4) or 16 (Kimi-K3)
// experts are too few problems to fill a GPU in a launch of their own, and a
// launch fewer is one host enqueue fewer per MoE layer. Larger groups (a
// prompt) keep two launches rather than gather their rows twice.
constexpr int64_t kFusedGateUpRows = 128;

bool decode_sized(int64_t m) { return 2 * m <= kFusedGateUpRows; }

bool fused_gate_up(const std::vector<Backend::GroupedProblem>& gate, const std::vector<Backend::GroupedProblem>& up,
                   int64_t m) {
  if (!decode_sized(m)) return false;
  const Tensor& w0 = gate.front().w;
  for (const auto* list : {&gate, &up})
    for (const Backend::GroupedProblem& p : *list)
      if (p.w.type != w0.type || p.w.width() != w0.width() || p.w.rows() != w0.rows()) return false;
  return true;
}

}  // namespace

void run_routed_experts(Backend& be, ExpertSource& source, int layer, const Tensor& x, const Routing& routing,
                        const ExpertFfn& ffn, bool accumulate, const Tensor& out, NextLayerGuesser* guesser,
                        const std::function<void()>& meanwhile) {
  const int64_t n = x.rows(), k = routing.ids.width(), d = out.width();
  if (routing.ids.rows() != n || out.rows() != n || routing.weights.numel() != n * k) {
    throw ModelError("routed experts of layer " + std::to_string(layer) + ": routing and batch disagree");
  }
  const bool guessed = guesser && routing.guess_layer >= 0;
  if (guessed && (routing.guess.rows() != n || routing.guess.width() != guesser->per_layer() ||
                  routing.ids.data != routing.id_block.data ||
                  routing.id_block.numel() != n * k + routing.guess.numel())) {
    throw ModelError("routed experts of layer " + std::to_string(layer) + ": the guess is not in make_routing's block");
  }
  // The layer's one host synchronisation (none where the host knows the ids);
  // with a guess, its ids come in the same download.
  std::vector<int32_t> ids;
  if (!guessed && !routing.host_ids.empty()) {
    if (routing.host_ids.size() != static_cast<size_t>(n * k)) {
      throw ModelError("routed experts of layer " + std::to_string(layer) + ": host ids and batch disagree");
    }
    ids = routing.host_ids;
    if (meanwhile) meanwhile();
  } else {
    ids.resize(static_cast<size_t>(guessed ? routing.id_block.numel() : n * k));
    be.start_download(guessed ? routing.id_block : routing.ids);
    if (meanwhile) meanwhile();
    be.finish_download(ids.data());
  }

  // The picks (t * k + j) of each expert, experts in ascending id order; the
  // request lists them in that order, and a routing trace records it.
  std::map<int32_t, std::vector<int32_t>> picks_of;
  for (int64_t p = 0; p < n * k; ++p) picks_of[ids[size_t(p)]].push_back(static_cast<int32_t>(p));
  std::vector<int32_t> experts;
  for (const auto& [e, ps] : picks_of) experts.push_back(e);
  const int n_experts = static_cast<int>(experts.size());
  if (guesser) guesser->score(layer, experts);
  std::unique_ptr<ExpertRequest> request = source.acquire(layer, experts.data(), n_experts, be.stream());
  const bool early_release = request->waits_for_released();
  // After this layer's own acquire, so its demand reads are queued first.
  if (guessed) guesser->issue(source, routing.guess_layer, ids.data() + n * k, n);

  // Groups in the order they are computed: the resident experts together, then
  // each other expert alone (it may have to wait for a slot that an earlier
  // one frees). Rows are laid out in that order, so each group's rows are one range.
  std::vector<std::vector<int>> groups(1);
  for (int i = 0; i < n_experts; ++i)
    if (request->resident(i)) groups[0].push_back(i);
  for (int i = 0; i < n_experts; ++i)
    if (!request->resident(i)) groups.push_back({i});
  std::vector<int32_t> tokens, picks;
  std::vector<int64_t> first(static_cast<size_t>(n_experts)), count(static_cast<size_t>(n_experts));
  for (const auto& g : groups) {
    for (int i : g) {
      const std::vector<int32_t>& ps = picks_of[experts[size_t(i)]];
      first[size_t(i)] = static_cast<int64_t>(picks.size());
      count[size_t(i)] = static_cast<int64_t>(ps.size());
      for (int32_t p : ps) {
        picks.push_back(p);
        tokens.push_back(static_cast<int32_t>(p / k));
      }
    }
  }
  // One upload for the lists (tokens, each pick's row, then each decode-sized
  // group's tokens twice over for fused_gate_up, at doubled_at[group]): a copy
  // per list per layer costs a launch each.
  const int64_t m_all = static_cast<int64_t>(picks.size());
  std::vector<int32_t> lists_host = tokens;
  lists_host.resize(size_t(m_all + n * k), -1);
  for (int64_t r = 0; r < m_all; ++r) lists_host[size_t(m_all + picks[size_t(r)])] = static_cast<int32_t>(r);
  std::vector<int64_t> doubled_at(groups.size(), -1);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (groups[gi].empty()) continue;
    int64_t m = 0;
    for (int i : groups[gi]) m += count[size_t(i)];
    if (!decode_sized(m)) continue;
    doubled_at[gi] = static_cast<int64_t>(lists_host.size());
    const auto from = tokens.begin() + first[size_t(groups[gi].front())];
    for (int twice = 0; twice < 2; ++twice) lists_host.insert(lists_host.end(), from, from + m);
  }
  const Tensor lists = be.upload(XPACK_TYPE_I32, lists_host.data(), 1, static_cast<int64_t>(lists_host.size()));
  const Tensor tokens_t = lists.row_range(0, m_all), rows_t = lists.row_range(m_all, n * k);
  // Every pick's own row of the experts' outputs, until the rank-order sum.
  const Tensor ys_all = be.empty(XPACK_TYPE_F32, d, m_all);

  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::vector<int>& g = groups[gi];
    if (g.empty()) continue;
    const int64_t r0 = first[size_t(g.front())];
    int64_t m = 0;
    std::vector<Backend::GroupedProblem> gate, up, down;
    for (int i : g) {
      const ExpertReady ready = request->get(i);
      be.wait_event(ready.ready_event);
      const GatedMatrices mats = ffn.matrices(*ready.weights);
      const int64_t row = first[size_t(i)] - r0, rows = count[size_t(i)];
      gate.push_back({mats.gate, row, rows});
      up.push_back({mats.up, row, rows});
      down.push_back({mats.down, row, rows});
      m += rows;
    }
    const int64_t d_ff = gate.front().w.rows();
    Tensor gs, us;
    if (fused_gate_up(gate, up, m)) {
      // The group's rows gathered twice: the gate's problems read the first m,
      // the up's the next m, all in one grouped launch (each output row is its
      // problem's product alone, bit for bit, as with two launches).
      const Tensor xs = be.empty(XPACK_TYPE_F32, x.width(), 2 * m);
      be.get_rows(x, lists.row_range(doubled_at[gi], 2 * m), xs);
      std::vector<Backend::GroupedProblem> both = gate;
      for (Backend::GroupedProblem p : up) {
        p.row += m;
        both.push_back(p);
      }
      const Tensor gu = be.empty(XPACK_TYPE_F32, d_ff, 2 * m);
      be.grouped_matmul(both, xs, gu);
      gs = gu.row_range(0, m);
      us = gu.row_range(m, m);
    } else {
      const Tensor xs = be.empty(XPACK_TYPE_F32, x.width(), m);
      be.get_rows(x, tokens_t.row_range(r0, m), xs);
      gs = be.empty(XPACK_TYPE_F32, d_ff, m);
      us = be.empty(XPACK_TYPE_F32, d_ff, m);
      be.grouped_matmul(gate, xs, gs);
      be.grouped_matmul(up, xs, us);
    }
    ffn.act(gs, us);
    be.grouped_matmul(down, gs, ys_all.row_range(r0, m));
    if (early_release)
      for (int i : g) request->release(i);
  }
  request.reset();
  // The rest of the step up to the next router's ids: no expert in it.
  be.capture_until_download(n, /*step_start=*/false);
  be.combine_picks(ys_all, rows_t, routing.weights, k, accumulate, out);
}

}  // namespace xrun
