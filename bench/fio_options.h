// Command line of xpack-fio (over tools/cli_app.h): its own flags, and fio's names for
// the same things (--filename, --rw, --iodepth, --numjobs, --direct, --output-format),
// so that a fio command line's read options carry over.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xpack::bench {

struct FioOptions {
  std::string file;
  uint64_t size = 1ull << 30;      // for creating --file; given: reads stay in its first SIZE bytes
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
};

extern const char* const kFioModes[5];

// Parses argv into *out. nullopt: run with *out. Otherwise the exit status to return at
// once: 0 after --help or --version (printed on stdout), 2 after a usage error (one
// line on stderr; its text also in *message when given).
std::optional<int> parse_fio_args(int argc, char** argv, FioOptions* out, std::string* message = nullptr);

}  // namespace xpack::bench
