// tokenizer.ggml.* metadata through libxpack's public C API.
#include <cstdint>
#include <string>

#include "tokenizer.h"
#include "weights.h"
#include "xpack/xpack.h"

namespace xrun {
namespace {

class MetaReader {
 public:
  explicit MetaReader(xpack_gguf* g) : g_(g) {}

  int64_t index(const std::string& key) const {
    const int64_t idx = xpack_gguf_find_key(g_, key.c_str());
    return idx < 0 ? -1 : idx;
  }

  [[noreturn]] void fail(const std::string& key, int rc) const {
    const char* msg = xpack_gguf_errmsg(g_);
    throw ModelError("tokenizer metadata: key " + key + ": " +
                     (msg && *msg ? std::string(msg) : std::string(xpack_strerror(rc))));
  }

  bool has(const std::string& key) const { return index(key) >= 0; }

  std::string string(const std::string& key) const {
    const int64_t idx = index(key);
    if (idx < 0) throw ModelError("missing key " + key);
    const char* s = nullptr;
    size_t len = 0;
    if (int rc = xpack_gguf_get_string(g_, idx, &s, &len); rc != 0) fail(key, rc);
    return std::string(s, len);
  }

  int64_t integer(const std::string& key, int64_t fallback) const {
    const int64_t idx = index(key);
    if (idx < 0) return fallback;
    int64_t v = 0;
    if (int rc = xpack_gguf_get_int(g_, idx, &v); rc != 0) fail(key, rc);
    return v;
  }

  // A token id stored as u32, where 0xFFFFFFFF (or any negative) means "none".
  int32_t token_id(const std::string& key, int32_t fallback) const {
    const int64_t v = integer(key, fallback);
    if (v < 0 || v >= int64_t(INT32_MAX)) return -1;
    return int32_t(v);
  }

  uint64_t array_size(int64_t idx, const std::string& key) const {
    int elem = 0;
    uint64_t n = 0;
    if (int rc = xpack_gguf_get_array(g_, idx, &elem, &n); rc != 0) fail(key, rc);
    return n;
  }

  std::vector<std::string> strings(const std::string& key) const {
    std::vector<std::string> out;
    const int64_t idx = index(key);
    if (idx < 0) return out;
    const uint64_t n = array_size(idx, key);
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      const char* s = nullptr;
      size_t len = 0;
      if (int rc = xpack_gguf_get_array_string(g_, idx, i, &s, &len); rc != 0) fail(key, rc);
      out.emplace_back(s, len);
    }
    return out;
  }

  std::vector<float> floats(const std::string& key) const {
    std::vector<float> out;
    const int64_t idx = index(key);
    if (idx < 0) return out;
    const uint64_t n = array_size(idx, key);
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      double v = 0;
      if (int rc = xpack_gguf_get_array_float(g_, idx, i, &v); rc != 0) fail(key, rc);
      out.push_back(float(v));
    }
    return out;
  }

  std::vector<int32_t> ints(const std::string& key) const {
    std::vector<int32_t> out;
    const int64_t idx = index(key);
    if (idx < 0) return out;
    const uint64_t n = array_size(idx, key);
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      int64_t v = 0;
      if (int rc = xpack_gguf_get_array_int(g_, idx, i, &v); rc != 0) fail(key, rc);
      out.push_back(int32_t(v));
    }
    return out;
  }

 private:
  xpack_gguf* g_;
};

}  // namespace

VocabData read_vocab(xpack_gguf* g) {
  if (!g) throw ModelError("read_vocab: no GGUF handle");
  const MetaReader m(g);
  VocabData v;
  v.model = m.string("tokenizer.ggml.model");
  if (m.has("tokenizer.ggml.pre")) v.pre = m.string("tokenizer.ggml.pre");
  if (!m.has("tokenizer.ggml.tokens")) throw ModelError("missing key tokenizer.ggml.tokens");
  v.tokens = m.strings("tokenizer.ggml.tokens");
  v.scores = m.floats("tokenizer.ggml.scores");
  v.types = m.ints("tokenizer.ggml.token_type");
  v.merges = m.strings("tokenizer.ggml.merges");
  const bool spm = v.model == "llama";
  // llama.cpp's defaults when a key is absent.
  v.bos = m.token_id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  v.eos = m.token_id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  v.unk = m.token_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.add_bos = m.integer("tokenizer.ggml.add_bos_token", spm ? 1 : 0) != 0;
  v.add_eos = m.integer("tokenizer.ggml.add_eos_token", 0) != 0;
  v.add_space_prefix = m.integer("tokenizer.ggml.add_space_prefix", spm ? 1 : 0) != 0;
  return v;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(xpack_gguf* g) {
  return std::make_unique<Tokenizer>(read_vocab(g));
}

}  // namespace xrun
