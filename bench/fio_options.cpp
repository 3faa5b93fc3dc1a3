#include "fio_options.h"

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace xpack::bench {

const char* const kFioModes[5] = {"buffered", "pread-direct", "uring", "uring-fixed",
                                  "uring-sqpoll"};

const char* const kFioUsage = R"(usage: xpack-fio --file PATH [options]

Measures SSD -> pinned host memory read throughput the way libxpack reads experts.

  --file PATH          file to read; created with random data of --size if missing
  --size N             size of a created file (default 1G)
  --bs N               block size of each read (default 1M; multiple of 4K)
  --qd N               reads in flight (iodepth; threads for buffered/pread-direct) (default 32)
  --pattern rand|seq   random or sequential block order (default rand)
  --runtime SEC        seconds per mode (default 10 unless --ios is given)
  --ios N              stop each mode after N reads
  --mode MODE          buffered | pread-direct | uring | uring-fixed | uring-sqpoll | all
                       (default uring-fixed; may be repeated or comma-separated)
                         buffered      pread through the page cache, then memcpy to pinned memory
                         pread-direct  O_DIRECT pread from --qd threads (the seed's path)
                         uring         io_uring O_DIRECT reads into plain buffers
                         uring-fixed   io_uring with registered buffers and registered files
                         uring-sqpoll  uring-fixed plus a kernel submission-polling thread
  --pack PACK          read the expert objects of an Expert Pack in a routing-like random
                       order (one object per read; --bs and --file are taken from the pack)
  --splits K           uring modes: split each read into K aligned ranges (default 1)
  --h2d                also copy every block to the GPU (needs a CUDA build)
  --small-pages        stage in 4 KiB pages even where 2 MiB pages are available
                       (diagnostics: what huge pages bring, in the same run)
  --json               one JSON object per mode on stdout instead of the table
  --help               this text

Sizes take K, M, G, T suffixes (powers of two: 4K = 4096), optionally followed by iB/B.
GB/s is 10^9 bytes per second. CPU seconds per GB is user+system time of this process
(getrusage) per 10^9 bytes. As root the page cache is dropped before each mode
(XPACK_FIO_KEEP_CACHE=1 in the environment keeps it). The "pages" column is the page
size backing most of the staging memory and the share in huge pages (a warning on
stderr when huge pages were wanted but not had: reads above ~1 MiB are then split).
)";

std::optional<uint64_t> parse_size(const std::string& s) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0) return std::nullopt;
  std::string suffix(end);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      case 'B': shift = 0; break;
      default: return std::nullopt;
    }
    std::string rest = suffix.substr(suffix[0] == 'B' ? 0 : 1);
    if (!(rest.empty() || rest == "B" || rest == "IB")) return std::nullopt;
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return std::nullopt;
  return static_cast<uint64_t>(v) << shift;
}

static Status add_modes(FioOptions& o, const std::string& list) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string m = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (m == "all") {
      for (const char* x : kFioModes) o.modes.push_back(x);
    } else {
      bool known = false;
      for (const char* x : kFioModes) known |= m == x;
      if (!known) return err(XPACK_E_INVALID_ARG, "unknown --mode '{}'", m);
      o.modes.push_back(m);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return {};
}

Result<FioOptions> parse_fio_args(int argc, char** argv) {
  FioOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    auto need = [&](const char* flag) -> Result<std::string> {
      if (has_inline) return value;
      if (i + 1 >= argc) return err(XPACK_E_INVALID_ARG, "{} needs a value", flag);
      return std::string(argv[++i]);
    };
    auto size_arg = [&](const char* flag) -> Result<uint64_t> {
      XPACK_ASSIGN_OR_RETURN(std::string v, need(flag));
      auto n = parse_size(v);
      if (!n) return err(XPACK_E_INVALID_ARG, "{}: '{}' is not a size (e.g. 4K, 1M, 2G)", flag, v);
      return *n;
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--file") {
      XPACK_ASSIGN_OR_RETURN(o.file, need("--file"));
    } else if (a == "--size") {
      XPACK_ASSIGN_OR_RETURN(o.size, size_arg("--size"));
      o.size_given = true;
    } else if (a == "--bs") {
      XPACK_ASSIGN_OR_RETURN(o.bs, size_arg("--bs"));
    } else if (a == "--qd" || a == "--iodepth") {
      XPACK_ASSIGN_OR_RETURN(uint64_t qd, size_arg("--qd"));
      if (qd == 0 || qd > 4096) return err(XPACK_E_INVALID_ARG, "--qd must be 1..4096");
      o.qd = static_cast<uint32_t>(qd);
    } else if (a == "--pattern") {
      XPACK_ASSIGN_OR_RETURN(std::string p, need("--pattern"));
      if (p == "rand" || p == "randread") o.random = true;
      else if (p == "seq" || p == "read") o.random = false;
      else return err(XPACK_E_INVALID_ARG, "--pattern must be rand or seq, not '{}'", p);
    } else if (a == "--runtime") {
      XPACK_ASSIGN_OR_RETURN(std::string v, need("--runtime"));
      char* end = nullptr;
      o.runtime_s = std::strtod(v.c_str(), &end);
      if (!end || *end != '\0' || !(o.runtime_s > 0))
        return err(XPACK_E_INVALID_ARG, "--runtime: '{}' is not a positive number of seconds", v);
      o.runtime_given = true;
    } else if (a == "--ios") {
      XPACK_ASSIGN_OR_RETURN(o.ios, size_arg("--ios"));
      if (o.ios == 0) return err(XPACK_E_INVALID_ARG, "--ios must be > 0");
    } else if (a == "--mode") {
      XPACK_ASSIGN_OR_RETURN(std::string m, need("--mode"));
      XPACK_TRY(add_modes(o, m));
    } else if (a == "--pack") {
      XPACK_ASSIGN_OR_RETURN(o.pack, need("--pack"));
    } else if (a == "--splits") {
      XPACK_ASSIGN_OR_RETURN(uint64_t k, size_arg("--splits"));
      if (k == 0 || k > 256) return err(XPACK_E_INVALID_ARG, "--splits must be 1..256");
      o.splits = static_cast<uint32_t>(k);
    } else if (a == "--h2d") {
      o.h2d = true;
    } else if (a == "--small-pages") {
      o.small_pages = true;
    } else if (a == "--json") {
      o.json = true;
    } else {
      return err(XPACK_E_INVALID_ARG, "unknown argument '{}' (see --help)", argv[i]);
    }
  }
  if (o.help) return o;
  if (o.file.empty() && o.pack.empty()) return err(XPACK_E_INVALID_ARG, "--file or --pack is required");
  if (!o.file.empty() && !o.pack.empty())
    return err(XPACK_E_INVALID_ARG, "--file and --pack are exclusive");
  if (o.pack.empty() && (o.bs == 0 || o.bs % 4096 != 0))
    return err(XPACK_E_INVALID_ARG, "--bs must be a non-zero multiple of 4K (O_DIRECT), got {}", o.bs);
  if (o.ios > 0 && !o.runtime_given) o.runtime_s = 0;  // only the I/O count stops
  if (o.modes.empty()) o.modes.push_back("uring-fixed");
  return o;
}

}  // namespace xpack::bench
