// Command line of xpack-fio: fio-like flags, sizes with K/M/G suffixes (powers of two).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace xpack::bench {

struct FioOptions {
  std::string file;
  uint64_t size = 1ull << 30;      // for creating --file
  bool size_given = false;
  uint64_t bs = 1ull << 20;
  uint32_t qd = 32;
  bool random = true;
  double runtime_s = 10;
  bool runtime_given = false;
  uint64_t ios = 0;                // 0 = until runtime
  std::vector<std::string> modes;  // expanded ("all" -> every mode)
  std::string pack;
  uint32_t splits = 1;
  bool h2d = false;
  bool small_pages = false;        // force 4 KiB staging pages (diagnostics)
  bool json = false;
  bool help = false;
};

extern const char* const kFioModes[5];
extern const char* const kFioUsage;

// "4K", "1M", "2G", "512", "64KiB", "1m" -> bytes. nullopt on junk or overflow.
std::optional<uint64_t> parse_size(const std::string& s);

Result<FioOptions> parse_fio_args(int argc, char** argv);

}  // namespace xpack::bench
