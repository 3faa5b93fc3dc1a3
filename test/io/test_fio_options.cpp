// xpack-fio's command line: its own flags, fio's names for the same things, and what
// is refused (unknown flags, bad numbers, suffixed counts, conflicting values).
#include <doctest/doctest.h>

#include <vector>

#include "cli_app.h"
#include "cli_parse.h"
#include "fio_options.h"

using namespace xpack::bench;

namespace {

using Parsed = xpack::test::Parsed<FioOptions>;

Parsed parse(std::vector<const char*> args) {
  return xpack::test::parse_argv<FioOptions>("xpack-fio", parse_fio_args, std::move(args));
}

// A usage error (exit 2) whose one-line message contains `want`.
void refused(std::vector<const char*> args, const std::string& want) {
  xpack::test::check_refused(parse(std::move(args)), want);
}

// The two command lines give the same options.
void same(std::vector<const char*> a, std::vector<const char*> b) {
  Parsed x = parse(std::move(a)), y = parse(std::move(b));
  CAPTURE(x.message);
  CAPTURE(y.message);
  REQUIRE(!x.rc);
  REQUIRE(!y.rc);
  CHECK(x.o.file == y.o.file);
  CHECK(x.o.size == y.o.size);
  CHECK(x.o.size_given == y.o.size_given);
  CHECK(x.o.bs == y.o.bs);
  CHECK(x.o.qd == y.o.qd);
  CHECK(x.o.random == y.o.random);
  CHECK(x.o.runtime_s == y.o.runtime_s);
  CHECK(x.o.ios == y.o.ios);
  CHECK(x.o.modes == y.o.modes);
  CHECK(x.o.json == y.o.json);
}

}  // namespace

TEST_CASE("sizes take binary K/M/G/T suffixes (cli::parse_size)") {
  auto size = [](const char* s) -> std::optional<uint64_t> {
    uint64_t v = 0;
    std::string why;
    if (!xpack::cli::parse_size(s, 1, 0, UINT64_MAX, &v, &why)) return std::nullopt;
    return v;
  };
  CHECK(size("4096") == 4096u);
  CHECK(size("4K") == 4096u);
  CHECK(size("4k") == 4096u);
  CHECK(size("64KiB") == 65536u);
  CHECK(size("1M") == (1u << 20));
  CHECK(size("1MB") == (1u << 20));
  CHECK(size("2G") == (2ull << 30));
  CHECK(size("1T") == (1ull << 40));
  CHECK(size("512B") == 512u);
  CHECK(!size(""));
  CHECK(!size("K"));
  CHECK(!size("-4K"));
  CHECK(!size("4X"));
  CHECK(!size("4KX"));
  CHECK(!size("99999999999999999999"));
  CHECK(!size("17179869184G"));  // overflows 64 bits
}

TEST_CASE("native flags, --key value and --key=value") {
  auto p = parse({"--file", "f", "--bs", "4M", "--qd", "16", "--pattern", "seq", "--runtime", "2.5", "--mode",
                  "uring,buffered", "--json", "--splits=4", "--size=2G", "--small-pages", "--h2d"});
  REQUIRE(!p.rc);
  CHECK(p.o.file == "f");
  CHECK(p.o.bs == (4u << 20));
  CHECK(p.o.qd == 16);
  CHECK(!p.o.random);
  CHECK(p.o.runtime_s == 2.5);
  CHECK(p.o.runtime_given);
  CHECK(p.o.json);
  CHECK(p.o.splits == 4);
  CHECK(p.o.size == (2ull << 30));
  CHECK(p.o.size_given);
  CHECK(p.o.small_pages);
  CHECK(p.o.h2d);
  CHECK(p.o.modes == std::vector<std::string>{"uring", "buffered"});

  p = parse({"--file=f", "--mode", "all", "--ios", "100"});
  REQUIRE(!p.rc);
  CHECK(p.o.modes.size() == 5);
  CHECK(p.o.ios == 100);
  CHECK(p.o.runtime_s == 0);  // --ios alone: no time limit

  p = parse({"--file", "f", "--mode", "uring", "--mode", "pread-direct"});  // repeated: both
  REQUIRE(!p.rc);
  CHECK(p.o.modes == std::vector<std::string>{"uring", "pread-direct"});

  p = parse({"--file", "f"});
  REQUIRE(!p.rc);
  CHECK(p.o.modes == std::vector<std::string>{"uring-fixed"});
  CHECK(p.o.runtime_s == 10);
  CHECK(p.o.qd == 32);
  CHECK(p.o.bs == (1u << 20));
  CHECK(p.o.random);
  CHECK(!p.o.size_given);
  CHECK(!p.o.json);

  p = parse({"--pack", "m.xpack", "--bs", "1000"});  // --bs is the pack's: not checked
  REQUIRE(!p.rc);
  CHECK(p.o.pack == "m.xpack");
}

TEST_CASE("--help and --version exit 0 at once") {
  auto p = parse({"--help"});
  REQUIRE(p.rc);
  CHECK(*p.rc == 0);
  p = parse({"--version"});
  REQUIRE(p.rc);
  CHECK(*p.rc == 0);
}

TEST_CASE("counts are whole numbers: --ios 1M is refused, not 1,048,576 reads") {
  refused({"--file", "f", "--ios", "1M"}, "--ios");
  refused({"--file", "f", "--ios", "1M"}, "a count takes no K/M/G/T suffix");
  refused({"--file", "f", "--qd", "1K"}, "a count takes no K/M/G/T suffix");
  refused({"--file", "f", "--iodepth", "2k"}, "--iodepth");
  refused({"--file", "f", "--splits", "1M"}, "--splits");
  refused({"--file", "f", "--numjobs", "1K"}, "--numjobs");
  refused({"--file", "f", "--ios", "0"}, "out of range");
  refused({"--file", "f", "--qd", "0"}, "--qd: 0 is out of range (1..4096)");
  refused({"--file", "f", "--qd", "4097"}, "out of range");
  refused({"--file", "f", "--splits", "257"}, "out of range");
  refused({"--file", "f", "--qd", "-1"}, "expected a whole number");
  refused({"--file", "f", "--qd", "0x10"}, "expected a whole number");
  refused({"--file", "f", "--ios", "99999999999999999999"}, "out of range");
}

TEST_CASE("bad input is refused with a message naming the flag") {
  refused({}, "--file or --pack is required");
  refused({"--file", "f", "--bs", "1000"}, "multiple of 4K");
  refused({"--file", "f", "--bs", "0"}, "--bs");
  refused({"--file", "f", "--bs", "1Q"}, "expected a size");
  refused({"--file", "f", "--mode", "turbo"}, "'turbo' is not one of");
  refused({"--file", "f", "--mode", "uring,"}, "'' is not one of");
  refused({"--file", "f", "--pattern", "zigzag"}, "--pattern");
  refused({"--file", "f", "--runtime", "-1"}, "--runtime");
  refused({"--file", "f", "--runtime", "0"}, "out of range");
  refused({"--file", "f", "--runtime", "nan"}, "expected a number");
  refused({"--file", "f", "--runtime", "inf"}, "expected a number");
  refused({"--file", "f", "--runtime", "10s"}, "expected a number");
  refused({"--file", "f", "--bs"}, "--bs needs a value");
  refused({"--file", "f", "--pack", "p"}, "exclusive");
  refused({"--file", "f", "--frobnicate"}, "unknown option --frobnicate");
  refused({"--file", "f", "--ioengine=libaio"}, "unknown option --ioengine");
  refused({"--file", "f", "stray"}, "unexpected argument 'stray'");
  refused({"--file", "f", "--mode", "uring", "stray"}, "unexpected argument 'stray'");
  refused({"--file", "f", "--json=maybe"}, "--json");
  refused({"--file", "f", "--rw", "randwrite"}, "--rw: 'randwrite' is not one of read, randread");
  refused({"--file", "f", "--direct", "2"}, "--direct: 2 is out of range (0..1)");
  refused({"--file", "f", "--output-format", "terse"}, "--output-format");
  refused({"--file", "f", "--numjobs", "4"}, "xpack-fio runs one job");
}

TEST_CASE("fio's names give the same options as xpack-fio's") {
  same({"--file", "f"}, {"--filename", "f"});
  same({"--file", "f", "--qd", "8"}, {"--filename=f", "--iodepth=8"});
  same({"--file", "f", "--pattern", "rand"}, {"--file", "f", "--rw", "randread"});
  same({"--file", "f", "--pattern", "seq"}, {"--file", "f", "--rw=read"});
  same({"--file", "f", "--json"}, {"--file", "f", "--output-format=json"});
  same({"--file", "f"}, {"--file", "f", "--output-format", "normal"});
  same({"--file", "f"}, {"--file", "f", "--numjobs", "1"});
  same({"--file", "f"}, {"--file", "f", "--direct=1"});
  same({"--file", "f", "--mode", "buffered"}, {"--file", "f", "--direct=0"});
  same({"--file", "f", "--mode", "uring,pread-direct"}, {"--file", "f", "--mode", "uring,pread-direct", "--direct", "1"});
  // fio's own command line for compare-fio.sh's run, read options only.
  same({"--file", "x.bin", "--bs", "1M", "--qd", "32", "--pattern", "rand", "--runtime", "15", "--json"},
       {"--filename=x.bin", "--rw=randread", "--bs=1M", "--iodepth=32", "--numjobs=1", "--direct=1",
        "--runtime=15", "--output-format=json"});
  // The same value twice is no conflict.
  same({"--file", "f", "--qd", "8"}, {"--file", "f", "--qd", "8", "--iodepth", "8"});
  same({"--file", "f"}, {"--file", "f", "--filename", "f"});
}

TEST_CASE("a native flag and its fio name that disagree are refused") {
  refused({"--file", "a", "--filename", "b"}, "--filename b conflicts with --file a");
  refused({"--file", "f", "--qd", "8", "--iodepth", "16"}, "--iodepth 16 conflicts with --qd 8");
  refused({"--file", "f", "--pattern", "seq", "--rw", "randread"}, "--rw randread conflicts with --pattern seq");
  refused({"--file", "f", "--json", "--output-format", "normal"}, "conflicts with --json");
  refused({"--file", "f", "--direct", "0", "--mode", "uring"}, "--direct 0 conflicts with --mode uring");
  refused({"--file", "f", "--direct", "1", "--mode", "buffered"}, "--direct 1 conflicts with --mode buffered");
  refused({"--file", "f", "--direct", "0", "--mode", "all"}, "conflicts with --mode");
}
