// Deterministic random tensor data and the streaming GGUF writer of xpack-synth.
// Data is generated block by block from a per-tensor stream, so a tensor's bytes do
// not depend on how it is cut into chunks: memory stays at one chunk (kChunkBytes)
// whatever the model's size, and a split set holds the single file's bytes.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "gguf/ggml_type.h"
#include "gguf/gguf_writer.h"
#include "progress_bar.h"
#include "synth_model.h"

namespace synth {

using xpack::Status;
namespace val = xpack::gguf::val;

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

// Each tensor's stream depends only on the seed and its name, so a split set and
// a single file written with the same options hold identical tensor bytes.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  uint64_t s = seed ^ h;
  return splitmix64(s);
}

void fill_random(uint8_t* p, size_t n, uint64_t& s) {
  while (n >= 8) {
    uint64_t r = splitmix64(s);
    std::memcpy(p, &r, 8);
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t r = splitmix64(s);
    std::memcpy(p, &r, n);
  }
}

// A positive normal f16 in [2^-11, 2^-7): always finite, and small enough that
// dequantized weights stay within about +-1 like real ones.
uint16_t random_f16_scale(uint64_t& s) {
  uint64_t r = splitmix64(s);
  uint16_t exp = static_cast<uint16_t>(4 + r % 4);
  return static_cast<uint16_t>((exp << 10) | ((r >> 8) & 0x3FF));
}

void put_u16le(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// One tensor's generator: next(dst, n) continues the stream where the last call
// stopped. n is a multiple of unit() except for the last call.
class TensorStream {
 public:
  TensorStream(const TensorSpec& t, uint64_t seed) : t_(t), s_(tensor_seed(seed, t.name)) {
    // Norm weights near 1 keep activations at their scale, as in a trained model.
    norm_ = t.type == F32 && ends_with(t.name, "norm.weight");
    if (t.type == F32 || t.type == I32) {
      unit_ = t.type == I32 ? 4 * t.ne[0] : 4;
    } else if (const auto* ti = xpack::gguf::type_info(t.type)) {
      unit_ = ti->block_bytes;
    }
  }
  size_t unit() const { return unit_; }

  Status next(uint8_t* dst, size_t n) {
    if (!t_.bytes.empty()) return next_bytes(dst, n);
    switch (t_.type) {
      case F32:
        for (size_t i = 0; i + 4 <= n; i += 4) {
          // Uniform in [-0.0625, 0.0625): small, finite, like initialised weights.
          float f = static_cast<float>(static_cast<int32_t>(splitmix64(s_) >> 32)) * (0.0625f / 2147483648.0f);
          if (norm_) f += 1.0f;
          std::memcpy(dst + i, &f, 4);
        }
        return {};
      case I32: return next_ids(dst, n);
      default: break;
    }
    if (unit_ == 0) return xpack::err(XPACK_E_UNKNOWN_TYPE, "no generator for type {}", t_.type);
    for (size_t b = 0; b + unit_ <= n; b += unit_) {
      uint8_t* blk = dst + b;
      fill_random(blk, unit_, s_);  // random quants, then valid scales on top
      switch (t_.type) {
        case Q8_0: put_u16le(blk, random_f16_scale(s_)); break;  // d @0
        case Q2_K:
          put_u16le(blk + 80, random_f16_scale(s_));  // d @80
          put_u16le(blk + 82, random_f16_scale(s_));  // dmin @82
          break;
        case Q3_K: put_u16le(blk + 108, random_f16_scale(s_)); break;              // d @108
        case MXFP4: blk[0] = static_cast<uint8_t>(116 + splitmix64(s_) % 9); break;  // 2^-12..2^-4
        default: return xpack::err(XPACK_E_UNSUPPORTED, "no generator for type {}", t_.type);
      }
    }
    return {};
  }

 private:
  // Set contents, continued from where the last call stopped.
  Status next_bytes(uint8_t* dst, size_t n) {
    if (pos_ + n > t_.bytes.size())
      return xpack::err(XPACK_E_INVALID_ARG, "{}: {} bytes set for a larger tensor", t_.name, t_.bytes.size());
    std::memcpy(dst, t_.bytes.data() + pos_, n);
    pos_ += n;
    return {};
  }

  // Hash-routing rows: ne0 distinct expert ids per token, as a trained table has.
  Status next_ids(uint8_t* dst, size_t n) {
    const uint64_t k = t_.ne[0], bound = t_.int_bound ? t_.int_bound : 1;
    if (k > bound) return xpack::err(XPACK_E_INVALID_ARG, "{}: {} distinct ids from {}", t_.name, k, bound);
    std::vector<int32_t> row(k);
    for (size_t r = 0; r + 4 * k <= n; r += 4 * k) {
      for (uint64_t j = 0; j < k; ++j) {
        int32_t v;
        do v = static_cast<int32_t>(splitmix64(s_) % bound);
        while (std::find(row.begin(), row.begin() + j, v) != row.begin() + j);
        row[j] = v;
      }
      std::memcpy(dst + r, row.data(), 4 * k);
    }
    return {};
  }

  const TensorSpec& t_;
  uint64_t s_;
  size_t unit_ = 0;
  size_t pos_ = 0;  // bytes of t_.bytes written so far
  bool norm_ = false;
};

Status write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return xpack::errno_error("write {}", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

Status write_zeros(int fd, uint64_t n, const std::string& path) {
  static const uint8_t zeros[4096] = {};
  while (n > 0) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof zeros));
    XPACK_TRY(write_all(fd, zeros, k, path));
    n -= k;
  }
  return {};
}

struct Progress {
  ProgressBar bar;
  uint64_t done = 0, total = 0;
};

Status write_body(int fd, const std::string& tmp, const xpack::gguf::Writer& w,
                  const std::vector<const TensorSpec*>& tensors, uint64_t seed, std::vector<uint8_t>& buf,
                  Progress& progress) {
  XPACK_ASSIGN_OR_RETURN(std::vector<uint8_t> header, w.header_bytes());
  XPACK_TRY(write_all(fd, header.data(), header.size(), tmp));
  uint64_t pos = header.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t at = w.data_offset() + w.tensor_offset(i), nbytes = w.tensor_nbytes(i);
    XPACK_TRY(write_zeros(fd, at - pos, tmp));
    if (!tensors[i]->bytes.empty() && tensors[i]->bytes.size() != nbytes)
      return xpack::err(XPACK_E_INVALID_ARG, "tensor {}: {} bytes set, {} needed", tensors[i]->name,
                        tensors[i]->bytes.size(), nbytes);
    TensorStream stream(*tensors[i], seed);
    if (stream.unit() == 0 || stream.unit() > kChunkBytes)
      return xpack::err(XPACK_E_UNSUPPORTED, "tensor {}: no generator for type {}", tensors[i]->name,
                        tensors[i]->type);
    const size_t chunk = kChunkBytes / stream.unit() * stream.unit();
    for (uint64_t off = 0; off < nbytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, nbytes - off));
      buf.assign(n, 0);
      XPACK_TRY(stream.next(buf.data(), n));
      XPACK_TRY(write_all(fd, buf.data(), n, tmp));
      off += n;
      progress.done += n;
      progress.bar.update("writing", progress.done, progress.total);
    }
    pos = at + nbytes;
  }
  return write_zeros(fd, w.total_size() - pos, tmp);
}

// PATH.tmp, fsync, rename: an interrupted run never leaves a truncated PATH.
Status write_file(const std::string& path, const xpack::gguf::Writer& w, const std::vector<const TensorSpec*>& tensors,
                  uint64_t seed, std::vector<uint8_t>& buf, Progress& progress) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return xpack::errno_error("create {}", tmp);
  Status s = write_body(fd, tmp, w, tensors, seed, buf, progress);
  if (s.ok() && ::fsync(fd) != 0) s = xpack::errno_error("fsync {}", tmp);
  if (::close(fd) != 0 && s.ok()) s = xpack::errno_error("close {}", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = xpack::errno_error("rename {}", path);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

std::string strip_gguf(const std::string& p) {
  const std::string ext = ".gguf";
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0)
    return p.substr(0, p.size() - ext.size());
  return p;
}

struct Part {
  std::string path;
  xpack::gguf::Writer writer;
  std::vector<const TensorSpec*> tensors;
};

}  // namespace

Status write_model(const Model& m, const Options& o, std::vector<std::string>* written, uint64_t* bytes) {
  std::vector<Part> parts;
  if (o.shards == 0) {
    parts.emplace_back();
    parts.back().path = o.out;
    for (const auto& kv : m.kvs) parts.back().writer.add_kv(kv);
    for (const auto& t : m.tensors) parts.back().tensors.push_back(&t);
  } else {
    // Like llama-gguf-split: contiguous runs of tensors, whole tensors only; all
    // metadata in the first shard, the three split keys in every shard.
    const size_t n = m.tensors.size();
    if (o.shards > n) return xpack::err(XPACK_E_INVALID_ARG, "--shards {} exceeds the {} tensors", o.shards, n);
    const size_t per = (n + o.shards - 1) / o.shards;
    const std::string prefix = strip_gguf(o.out);
    for (uint32_t k = 0; k < o.shards; ++k) {
      parts.emplace_back();
      Part& p = parts.back();
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, "-%05u-of-%05u.gguf", k + 1, o.shards);
      p.path = prefix + suffix;
      if (k == 0)
        for (const auto& kv : m.kvs) p.writer.add_kv(kv);
      p.writer.add_kv("split.no", val::u16(static_cast<uint16_t>(k)));
      p.writer.add_kv("split.count", val::u16(static_cast<uint16_t>(o.shards)));
      p.writer.add_kv("split.tensors.count", val::i32(static_cast<int32_t>(n)));
      for (size_t i = k * per; i < std::min(n, (k + 1) * per); ++i) p.tensors.push_back(&m.tensors[i]);
    }
  }
  Progress progress{ProgressBar(o.progress || (!o.quiet && ::isatty(STDERR_FILENO)))};
  for (Part& p : parts) {
    for (const auto* t : p.tensors) p.writer.add_tensor(t->name, t->type, t->ne);
    for (size_t i = 0; i < p.tensors.size(); ++i) progress.total += p.writer.tensor_nbytes(i);
  }
  std::vector<uint8_t> buf;  // one chunk, reused for every tensor of every shard
  for (Part& p : parts) {
    if (o.dry_run) {
      XPACK_TRY(p.writer.header_bytes());  // the same checks as a real run
      *bytes += p.writer.total_size();
      continue;
    }
    XPACK_TRY(write_file(p.path, p.writer, p.tensors, o.seed, buf, progress));
    *bytes += p.writer.total_size();
    written->push_back(p.path);
  }
  progress.bar.finish();
  return {};
}

}  // namespace synth
