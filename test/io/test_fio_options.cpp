// xpack-fio's command line: fio-style sizes and the flag set.
#include <doctest/doctest.h>

#include <vector>

#include "fio_options.h"

using namespace xpack::bench;

static xpack::Result<FioOptions> parse(std::vector<const char*> args) {
  args.insert(args.begin(), "xpack-fio");
  return parse_fio_args(static_cast<int>(args.size()), const_cast<char**>(args.data()));
}

TEST_CASE("sizes with K/M/G/T suffixes are powers of two") {
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size("4K") == 4096u);
  CHECK(parse_size("4k") == 4096u);
  CHECK(parse_size("64KiB") == 65536u);
  CHECK(parse_size("1M") == (1u << 20));
  CHECK(parse_size("1MB") == (1u << 20));
  CHECK(parse_size("2G") == (2ull << 30));
  CHECK(parse_size("1T") == (1ull << 40));
  CHECK(parse_size("512B") == 512u);
  CHECK(!parse_size(""));
  CHECK(!parse_size("K"));
  CHECK(!parse_size("-4K"));
  CHECK(!parse_size("4X"));
  CHECK(!parse_size("4KX"));
  CHECK(!parse_size("99999999999999999999"));
  CHECK(!parse_size("17179869184G"));  // overflows 64 bits
}

TEST_CASE("flags") {
  auto o = parse({"--file", "f", "--bs", "4M", "--qd", "16", "--pattern", "seq", "--runtime",
                  "2.5", "--mode", "uring,buffered", "--json"});
  REQUIRE(o.ok());
  CHECK(o->file == "f");
  CHECK(o->bs == (4u << 20));
  CHECK(o->qd == 16);
  CHECK(!o->random);
  CHECK(o->runtime_s == 2.5);
  CHECK(o->json);
  REQUIRE(o->modes.size() == 2);
  CHECK(o->modes[1] == "buffered");

  o = parse({"--file=f", "--mode", "all", "--ios", "100"});
  REQUIRE(o.ok());
  CHECK(o->modes.size() == 5);
  CHECK(o->ios == 100);
  CHECK(o->runtime_s == 0);  // --ios alone: no time limit

  o = parse({"--file", "f"});
  REQUIRE(o.ok());
  CHECK(o->modes == std::vector<std::string>{"uring-fixed"});
  CHECK(o->runtime_s == 10);

  CHECK(parse({"--help"})->help);
  CHECK(!parse({}).ok());                                     // no file
  CHECK(!parse({"--file", "f", "--bs", "1000"}).ok());        // not 4K-aligned
  CHECK(!parse({"--file", "f", "--mode", "turbo"}).ok());
  CHECK(!parse({"--file", "f", "--pattern", "zigzag"}).ok());
  CHECK(!parse({"--file", "f", "--qd", "0"}).ok());
  CHECK(!parse({"--file", "f", "--runtime", "-1"}).ok());
  CHECK(!parse({"--file", "f", "--bs"}).ok());                // missing value
  CHECK(!parse({"--file", "f", "--pack", "p"}).ok());         // exclusive
  CHECK(!parse({"--file", "f", "--frobnicate"}).ok());
}
