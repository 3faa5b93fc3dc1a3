#include "fio_options.h"

#include <cstdint>

#include "cli_app.h"

namespace xpack::bench {

const char* const kFioModes[5] = {"buffered", "pread-direct", "uring", "uring-fixed",
                                  "uring-sqpoll"};

namespace {

const char kAbout[] = "Measures SSD -> pinned host memory read throughput the way libxpack reads experts.";

const char kFooter[] =
    "fio's names work too where they mean the same: --filename, --rw read|randread,\n"
    "--iodepth, --numjobs 1, --direct 0|1 (0: the buffered mode; 1: the O_DIRECT modes),\n"
    "--size, --bs, --runtime, --output-format json|normal. Given together with\n"
    "xpack-fio's own name for the same thing they must agree.\n"
    "\n"
    "GB/s is 10^9 bytes per second. CPU seconds per GB is user+system time of this process\n"
    "(getrusage) per 10^9 bytes. As root the page cache is dropped before each mode\n"
    "(XPACK_FIO_KEEP_CACHE=1 in the environment keeps it). The \"pages\" column is the page\n"
    "size backing most of the staging memory and the share in huge pages (a warning on\n"
    "stderr when huge pages were wanted but not had: reads above ~1 MiB are then split).\n"
    "\n"
    "exit status: 0 success, 1 a mode failed, 2 usage error";

// "a,b" and repeated --mode: every name checked, "all" expanded.
bool add_modes(std::vector<std::string>* modes, const std::string& list, std::string* why) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string m = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (m == "all") {
      for (const char* x : kFioModes) modes->push_back(x);
    } else {
      bool known = false;
      for (const char* x : kFioModes) known |= m == x;
      if (!known) {
        *why = "--mode: '" + m + "' is not one of buffered, pread-direct, uring, uring-fixed, uring-sqpoll, all";
        return false;
      }
      modes->push_back(m);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

}  // namespace

std::optional<int> parse_fio_args(int argc, char** argv, FioOptions* out, std::string* message) {
  FioOptions o;
  cli::App app("xpack-fio", "xpack-fio --file PATH [options]", kAbout, kFooter);
  const uint64_t kMax = UINT64_MAX;

  // A native flag and its fio name write separate variables: both given must agree.
  std::string filename, pattern = "rand", rw, output_format;
  uint32_t iodepth = 0, numjobs = 1;
  uint64_t direct = 1;
  std::vector<std::string> mode_args;

  auto* file_opt = app.text("--file", "PATH", &o.file, "file to read; created with random data of --size if missing");
  auto* size_opt = app.size("--size", "SIZE", &o.size,
                            "size of a created file (default 1G); with an existing file, reads\n"
                            "stay within its first SIZE bytes (as fio's --size)",
                            1, 1, kMax);
  app.size("--bs", "SIZE", &o.bs, "block size of each read (default 1M; multiple of 4K)", 1, 1, kMax);
  auto* qd_opt = app.count("--qd", "N", &o.qd,
                           "reads in flight (iodepth; threads for buffered/pread-direct) (default 32)", 1, 4096);
  auto* pattern_opt = app.choice("--pattern", "rand|seq", &pattern, {"rand", "seq", "randread", "read"},
                                 "random or sequential block order (default rand)");
  auto* runtime_opt = app.real("--runtime", "SEC", &o.runtime_s, "seconds per mode (default 10 unless --ios is given)",
                               0.0, 1e9, true);
  app.count("--ios", "N", &o.ios, "stop each mode after N reads (a whole number: no K/M suffix)", 1, kMax);
  app.cli()
      .add_option("--mode", mode_args,
                  "buffered | pread-direct | uring | uring-fixed | uring-sqpoll | all\n"
                  "(default uring-fixed; may be repeated or comma-separated)\n"
                  "  buffered      pread through the page cache, then memcpy to pinned memory\n"
                  "  pread-direct  O_DIRECT pread from --qd threads (the seed's path)\n"
                  "  uring         io_uring O_DIRECT reads into plain buffers\n"
                  "  uring-fixed   io_uring with registered buffers and registered files\n"
                  "  uring-sqpoll  uring-fixed plus a kernel submission-polling thread")
      ->option_text("MODE")
      ->expected(1)  // one value per --mode: a stray word is not taken for a mode
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  auto* pack_opt = app.text("--pack", "PACK", &o.pack,
                            "read the expert objects of an Expert Pack in a routing-like random\n"
                            "order (one object per read; --bs and --file are taken from the pack)");
  app.count("--splits", "K", &o.splits, "uring modes: split each read into K aligned ranges (default 1)", 1, 256);
  app.flag("--h2d", &o.h2d, "also copy every block to the GPU (needs a CUDA build)");
  app.flag("--small-pages", &o.small_pages,
           "stage in 4 KiB pages even where 2 MiB pages are available\n"
           "(diagnostics: what huge pages bring, in the same run)");
  auto* json_opt = app.flag("--json", &o.json, "one JSON object per mode on stdout instead of the table");

  const std::string fio = "fio's names";
  auto* filename_opt = app.text("--filename", "PATH", &filename, "= --file")->group(fio);
  auto* rw_opt = app.choice("--rw", "read|randread", &rw, {"read", "randread"},
                            "= --pattern seq|rand (xpack-fio only reads)")->group(fio);
  auto* iodepth_opt = app.count("--iodepth", "N", &iodepth, "= --qd", 1, 4096)->group(fio);
  app.count("--numjobs", "N", &numjobs, "1 (xpack-fio runs one job)", 1, UINT32_MAX)->group(fio);
  auto* direct_opt = app.count("--direct", "0|1", &direct, "0: --mode buffered; 1: the O_DIRECT modes", 0, 1)->group(fio);
  auto* format_opt = app.choice("--output-format", "json|normal", &output_format, {"json", "normal"},
                                "json = --json; normal: the table (default)")->group(fio);

  auto done = [&](std::optional<int> rc) {
    if (message) *message = app.last_message();
    return rc;
  };
  auto fail = [&](const std::string& why) { return done(app.usage_error(why)); };
  if (auto rc = app.parse(argc, argv)) return done(rc);

  auto given = [](const CLI::Option* opt) { return opt->count() > 0; };
  if (given(filename_opt)) {
    if (given(file_opt) && filename != o.file)
      return fail("--filename " + filename + " conflicts with --file " + o.file);
    o.file = filename;
  }
  if (given(iodepth_opt)) {
    if (given(qd_opt) && iodepth != o.qd)
      return fail("--iodepth " + std::to_string(iodepth) + " conflicts with --qd " + std::to_string(o.qd));
    o.qd = iodepth;
  }
  o.random = pattern == "rand" || pattern == "randread";
  if (given(rw_opt)) {
    const bool rw_random = rw == "randread";
    if (given(pattern_opt) && rw_random != o.random)
      return fail("--rw " + rw + " conflicts with --pattern " + pattern);
    o.random = rw_random;
  }
  if (given(format_opt)) {
    if (given(json_opt) && output_format != "json") return fail("--output-format normal conflicts with --json");
    o.json = output_format == "json";
  }
  if (numjobs != 1)
    return fail("--numjobs " + std::to_string(numjobs) +
                ": xpack-fio runs one job (one ring, or one pool of --qd threads); for more reads in "
                "flight raise --iodepth");
  for (const auto& m : mode_args) {
    std::string why;
    if (!add_modes(&o.modes, m, &why)) return fail(why);
  }
  if (given(direct_opt)) {
    // fio's direct=0 is the page cache: xpack-fio's buffered mode; direct=1 every other mode.
    if (o.modes.empty() && direct == 0) o.modes.push_back("buffered");
    for (const auto& m : o.modes)
      if ((m == "buffered") != (direct == 0))
        return fail("--direct " + std::to_string(direct) + " conflicts with --mode " + m +
                    (direct == 0 ? " (an O_DIRECT mode)" : " (reads through the page cache)"));
  }
  o.size_given = given(size_opt);
  o.runtime_given = given(runtime_opt);
  if (o.file.empty() && o.pack.empty()) return fail("--file or --pack is required");
  if (!o.file.empty() && given(pack_opt)) return fail("--file and --pack are exclusive");
  if (o.pack.empty() && o.bs % 4096 != 0)
    return fail("--bs must be a non-zero multiple of 4K (O_DIRECT), got " + std::to_string(o.bs));
  if (o.ios > 0 && !o.runtime_given) o.runtime_s = 0;  // only the I/O count stops
  if (o.modes.empty()) o.modes.push_back("uring-fixed");
  *out = std::move(o);
  return done(std::nullopt);
}

}  // namespace xpack::bench
