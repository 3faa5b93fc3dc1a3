// Helpers for the pack suites: running the tools, building packs, raw header edits.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <xxhash.h>

#include "fixtures.h"

namespace xpack::test {

namespace fs = std::filesystem;

inline std::string tool(const std::string& name) { return (build_dir() / "tools" / name).string(); }

inline std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// Runs a command; returns its exit status, output in *out.
inline int run(const std::string& cmd, std::string* out = nullptr) {
  std::string o;
  int rc = run_command(cmd, &o);
  if (out) *out = o;
  return rc;
}

// Builds a pack with xpack-build (REQUIREs success); returns OUT prefix.
inline fs::path build(const fs::path& model, const fs::path& out, const std::string& extra = "") {
  std::string o;
  int rc = run(tool("xpack-build") + " " + q(model) + " -o " + q(out) + " " + extra, &o);
  INFO(o);
  REQUIRE(rc == 0);
  return out;
}

// Writes a synthetic model with xpack-synth (REQUIREs success).
inline fs::path synth(const fs::path& out, const std::string& args) {
  std::string o;
  int rc = run(tool("xpack-synth") + " -q " + args + " -o " + q(out), &o);
  INFO(o);
  REQUIRE(rc == 0);
  return out;
}

inline uint64_t rd64(const std::vector<uint8_t>& b, size_t off) {
  uint64_t v;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}
inline uint32_t rd32(const std::vector<uint8_t>& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}
inline void wr64(std::vector<uint8_t>& b, size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); }
inline void wr32(std::vector<uint8_t>& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }

// After editing header/index fields on purpose, makes both checksums valid again so
// the edit reaches the checks behind them (doc/pack-format.md: index checksum @224
// over [256, data_start), header checksum @248 over [0, 248)).
inline void reseal(std::vector<uint8_t>& b) {
  uint64_t data_start = rd64(b, 24);
  if (data_start > 256 && data_start <= b.size()) wr64(b, 224, XXH3_64bits(b.data() + 256, data_start - 256));
  wr64(b, 248, XXH3_64bits(b.data(), 248));
}

inline bool shared_or_skip(std::optional<fs::path>& dir) {
  dir = shared_dir();
  if (!dir) MESSAGE("SKIPPED: ../shared (oracle models) is not present");
  return dir.has_value();
}

}  // namespace xpack::test
