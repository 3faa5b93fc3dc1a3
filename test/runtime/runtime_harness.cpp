#include "runtime_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include <openssl/evp.h>

#include "fixtures.h"

namespace xrun_test {

std::string q(const fs::path& p) {
  std::string s = "'";
  for (char c : p.string()) s += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return s + "'";
}

RunResult run(const std::string& cmd) {
  xpack::test::TempDir tmp;
  fs::path err = tmp / "stderr";
  RunResult r;
  // run_command appends 2>&1 to the whole line; the subshell then points its
  // own stderr at a file, so stdout alone comes back through the pipe.
  r.rc = xpack::test::run_command("( exec 2>" + q(err) + "; " + cmd + " )", &r.out);
  std::ifstream f(err);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  return r;
}

fs::path xpack_run_exe() { return xpack::test::build_dir() / "examples" / "xpack-run"; }
fs::path xpack_build_exe() { return xpack::test::build_dir() / "tools" / "xpack-build"; }
fs::path xpack_synth_exe() { return xpack::test::build_dir() / "tools" / "xpack-synth"; }

fs::path source_root() {
  const char* v = std::getenv("XPACK_SOURCE_ROOT");
  return fs::path(v && *v ? v : ".");
}

std::string sha256_file(const fs::path& p) {
  std::vector<uint8_t> bytes = xpack::test::read_file(p);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

std::optional<fs::path> stories260k() {
  static const char* kSha = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d";
  std::vector<fs::path> candidates = {xpack::test::data_dir() / "stories260K.gguf"};
  if (auto s = xpack::test::shared_dir()) candidates.push_back(*s / "models" / "stories260K.gguf");
  for (const auto& c : candidates) {
    if (!fs::exists(c)) continue;
    if (sha256_file(c) != kSha) throw std::runtime_error(c.string() + " has the wrong sha256");
    return c;
  }
  return std::nullopt;
}

std::optional<fs::path> oracle_dir_with(const std::string& model_file) {
  auto shared = xpack::test::shared_dir();
  if (!shared || !fs::exists(*shared / "oracle" / "models" / model_file)) return std::nullopt;
  return *shared / "oracle";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f.good()) throw std::runtime_error(p.string() + ": cannot be read");
  return nlohmann::json::parse(f);
}

std::vector<float> read_f32(const fs::path& p) {
  std::vector<uint8_t> b = xpack::test::read_file(p);
  if (b.size() % 4 != 0) throw std::runtime_error(p.string() + ": size not a multiple of 4");
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}

size_t first_fragile_position(const nlohmann::json& route, size_t n_rows) {
  size_t first = n_rows;
  for (const auto& [layer, r] : route["moe"].items()) {
    const auto& pos = r["pos"];
    const auto& margin = r["margin"];
    for (size_t i = 0; i < pos.size(); ++i)
      if (!margin[i].is_null() && margin[i].get<double>() < 2e-5) first = std::min(first, pos[i].get<size_t>());
  }
  return first;
}

RowStats compare_rows(const std::vector<float>& got, const std::vector<float>& want, size_t n_rows, int n_vocab,
                      double tol) {
  const size_t need = n_rows * size_t(n_vocab);
  if (got.size() < need || want.size() < need)
    throw std::runtime_error("compare_rows: " + std::to_string(n_rows) + " rows asked, arrays of " +
                             std::to_string(got.size()) + " and " + std::to_string(want.size()) + " floats");
  RowStats s;
  for (size_t r = 0; r < n_rows; ++r) {
    double d = 0;
    for (size_t v = 0; v < size_t(n_vocab); ++v)
      d = std::max(d, std::fabs(double(got[r * n_vocab + v]) - double(want[r * n_vocab + v])));
    s.max_diff = std::max(s.max_diff, d);
    if (d <= tol)
      ++s.rows_ok;
    else if (s.first_fail < 0)
      s.first_fail = static_cast<long>(r);
  }
  return s;
}

const std::vector<Deepseek4Variant>& deepseek4_variants() {
  static const std::vector<Deepseek4Variant> v = {
      {"ratios [128,4,0,4,128], 2 hash layers, 4 output groups, a layer without clamp", "{}", 3},
      {"all CSA, no YaRN, rope over the whole head, hc_mult 3, 1 Sinkhorn pass, top-1 indexer, 1 output group, "
       "window 3, top-1 routing without normalisation",
       R"({"yarn": false, "n_rot": 64, "idx_dim": 64, "hc": 3, "sink_iters": 1, "norm": false, "scale": 1.0,
           "idx_top_k": 1, "o_groups": 1, "n_swa": 3, "n_shared": 1, "n_used": 1, "ratios": [4, 4, 4],
           "n_layer": 3, "hash": 0, "clamp": [0.5, 4.0, 1.0]})",
       5},
      {"every layer hash-routed, HCA between two window-only layers, 8 narrow heads",
       R"({"n_layer": 3, "ratios": [0, 128, 0], "hash": 3, "clamp": [2.0, 2.0, 2.0], "n_swa": 64,
           "head_dim": 32, "n_rot": 8, "n_head": 8, "o_groups": 2, "idx_top_k": 2})",
       7},
  };
  return v;
}

RunResult write_deepseek4_variant(const Deepseek4Variant& v, const fs::path& vocab, const fs::path& model) {
  std::string hp = v.hp;
  std::replace(hp.begin(), hp.end(), '\n', ' ');
  return run("python3 " + q(source_root() / "test" / "runtime" / "deepseek4_variant.py") + " " + q(model) +
             " --vocab-from " + q(vocab) + " --seed " + std::to_string(v.seed) + " --hp " + q(hp));
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace xrun_test
