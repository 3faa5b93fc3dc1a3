// Not built by meson: a reference-logits dumper linked against a llama.cpp
// build's libllama (test/runtime/llama_logits.sh builds it and regenerates the
// files in test/data/kimi-k3-kv-b/). It evaluates the prompt one token per
// llama_decode, then decodes greedily, and writes every row's logits:
//
//   llama_logits -m MODEL.gguf --ids PROMPT.ids -n N_GEN -t THREADS -o OUT
//     OUT.f32   [n_prompt + N_GEN][n_vocab] little-endian f32: row i is the
//               distribution after token i (the prompt, then each generated
//               token fed back)
//     OUT.json  prompt_ids, gen_ids, n_vocab and the run's settings
//
// The settings are the oracle's (../shared/oracle/MANIFEST.md): CPU only, no
// weight repacking, F32 K/V cache, flash attention off, one sequence. Greedy is
// argmax with ties to the lowest id. PROMPT.ids is a JSON list of token ids, as
// in ../shared/oracle/prompts.
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama_logits: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<llama_token> read_ids(const std::string& path) {
  std::ifstream f(path);
  if (!f) die("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  for (char& c : s)
    if (c == '[' || c == ']' || c == ',') c = ' ';
  std::istringstream in(s);
  std::vector<llama_token> ids;
  long v;
  while (in >> v) ids.push_back(static_cast<llama_token>(v));
  if (!in.eof()) die(path + ": not a JSON list of integers");
  if (ids.empty()) die(path + ": no ids");
  return ids;
}

std::string json_list(const std::vector<llama_token>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, ids_path, out;
  int n_gen = 32, n_threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "-m") model_path = next();
    else if (a == "--ids") ids_path = next();
    else if (a == "-o") out = next();
    else if (a == "-n") n_gen = std::atoi(next().c_str());
    else if (a == "-t") n_threads = std::atoi(next().c_str());
    else die("unknown argument " + a);
  }
  if (model_path.empty() || ids_path.empty() || out.empty() || n_gen < 0 || n_threads < 1)
    die("usage: llama_logits -m MODEL.gguf --ids PROMPT.ids -o OUT [-n N_GEN] [-t THREADS]");
  const std::vector<llama_token> prompt = read_ids(ids_path);

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  // No CPU weight repacking, as ../shared/oracle ran: with it this build aborts in
  // the scheduler on Kimi-K3's Q2_K/Q3_K experts (no backend for a repacked tensor).
  mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) die("cannot load " + model_path);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : prompt)
    if (t < 0 || t >= n_vocab) die("prompt id " + std::to_string(t) + " outside the vocabulary");

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>((prompt.size() + n_gen + 255) / 256 * 256);
  cp.n_batch = cp.n_ubatch = 512;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = n_threads;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create a context");

  std::vector<float> rows;
  std::vector<llama_token> gen;
  auto feed = [&](llama_token t) {
    llama_batch b = llama_batch_get_one(&t, 1);
    if (llama_decode(ctx, b) != 0) die("llama_decode failed");
    const float* l = llama_get_logits_ith(ctx, -1);
    if (!l) die("no logits");
    rows.insert(rows.end(), l, l + n_vocab);
    return static_cast<llama_token>(std::max_element(l, l + n_vocab) - l);
  };
  llama_token next = 0;
  for (llama_token t : prompt) next = feed(t);
  for (int k = 0; k < n_gen; ++k) {
    gen.push_back(next);
    next = feed(next);
  }

  FILE* f = std::fopen((out + ".f32").c_str(), "wb");
  if (!f || std::fwrite(rows.data(), sizeof(float), rows.size(), f) != rows.size() || std::fclose(f) != 0)
    die("cannot write " + out + ".f32");
  std::ofstream j(out + ".json");
  j << "{\n  \"model\": \"" << model_path.substr(model_path.find_last_of('/') + 1) << "\",\n"
    << "  \"n_vocab\": " << n_vocab << ",\n  \"n_rows\": " << rows.size() / n_vocab << ",\n"
    << "  \"prompt_ids\": " << json_list(prompt) << ",\n  \"gen_ids\": " << json_list(gen) << ",\n"
    << "  \"config\": {\"eval\": \"one token per llama_decode, greedy (argmax, ties to the lowest id)\", "
    << "\"kv_type\": \"f32\", \"flash_attn\": \"off\", \"device\": \"cpu\", \"threads\": " << n_threads << "}\n}\n";
  if (!j) die("cannot write " + out + ".json");

  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
