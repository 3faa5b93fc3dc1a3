// xpack-run's deepseek4 MoE block on the CPU for given layer inputs: the reference
// examples/python/moe_layer.py is compared with (python/tests/test_moe_layer.py).
// It runs the runtime's own code, not a copy of it: ds4::MoeBlock (router, hash
// routing, shared expert, routed experts through run_routed_experts) over the
// experts of an Expert Pack served by libxpack's cache, exactly as xpack-run does.
//
// usage: moe_layer_ref TRUNK.gguf PACK.xpack LAYER X.f32 TOKENS OUT.f32
//   X.f32:  little-endian float32 [n][n_embd], the block's input (after ffn_norm)
//   TOKENS: comma-separated token ids, n of them (hash-routed layers read them)
//   OUT.f32 receives [n][n_embd]: shared expert + weighted routed experts.
// Exit 0 ok, 1 failure (message on stderr), 2 usage error.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "experts_factory.h"
#include "models/deepseek4/hparams.h"
#include "models/deepseek4/moe.h"
#include "weights.h"
#include "xpack/xpack.h"

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "moe_layer_ref: %s\nusage: moe_layer_ref TRUNK.gguf PACK.xpack LAYER X.f32 TOKENS OUT.f32\n", why);
  return 2;
}

bool parse_ids(const std::string& s, std::vector<int32_t>* out) {
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) return false;
    out->push_back(static_cast<int32_t>(v));
  }
  return !out->empty();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace xrun;
  if (argc != 7) return usage("six arguments expected");
  const std::string trunk = argv[1], pack = argv[2], x_path = argv[4], out_path = argv[6];
  char* end = nullptr;
  const long layer = std::strtol(argv[3], &end, 10);
  if (*argv[3] == '\0' || *end != '\0' || layer < 0) return usage("LAYER must be a block index");
  std::vector<int32_t> tokens;
  if (!parse_ids(argv[5], &tokens)) return usage("TOKENS must be comma-separated token ids");
  try {
    Weights w(trunk);
    if (w.arch() != "deepseek4") throw ModelError(trunk + " is " + w.arch() + ", not deepseek4");
    const ds4::Hparams hp = ds4::load_hparams(w);
    if (layer >= hp.n_layer) throw ModelError("layer " + std::to_string(layer) + " of " + std::to_string(hp.n_layer));
    const int64_t n = static_cast<int64_t>(tokens.size()), d = hp.n_embd;
    std::ifstream xf(x_path, std::ios::binary);
    std::vector<float> x(static_cast<size_t>(n * d));
    xf.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
    if (!xf || xf.peek() != EOF)
      throw ModelError(x_path + ": expected " + std::to_string(n) + " x " + std::to_string(d) + " float32");
    for (int32_t t : tokens)
      if (t >= hp.n_vocab) throw ModelError("token " + std::to_string(t) + " outside the vocabulary");

    CpuBackend be(1);
    PackSourceOptions po;
    po.pack_path = pack;
    po.trunk_path = trunk;
    po.budget_bytes = 64u << 20;
    po.allow_buffered_io = true;  // tests keep packs on whatever filesystem TMPDIR is
    std::string why_not;
    std::unique_ptr<ExpertSource> experts = make_cache_experts(po, static_cast<int>(hp.n_expert), &why_not);
    if (!experts) throw ModelError("expert cache: " + why_not);
    ds4::MoeBlock moe(w, hp, be, layer, experts.get());
    const Tensor xt = be.upload(XPACK_TYPE_F32, x.data(), d, n);
    const Tensor tt = be.upload(XPACK_TYPE_I32, tokens.data(), 1, n);
    const Tensor out = be.alloc(XPACK_TYPE_F32, d, n);
    moe.forward(xt, tt, tokens.data(), out);
    std::vector<float> y(static_cast<size_t>(n * d));
    be.download(out, y.data());
    experts->finish();
    std::ofstream of(out_path, std::ios::binary | std::ios::trunc);
    of.write(reinterpret_cast<const char*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(float)));
    if (!of) throw ModelError("cannot write " + out_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_layer_ref: %s\n", e.what());
    return 1;
  }
  return 0;
}
