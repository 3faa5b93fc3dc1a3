// Driving a program's argv parser from a test: the parsed options or the exit
// status and message of a refusal, and the check that a command line is a
// usage error whose message names the problem.
#pragma once

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xpack::test {

template <class Options>
struct Parsed {
  std::optional<int> rc;  // nullopt: options to run with
  Options o;
  std::string message;
};

// parse(argc, argv, &options, &message) -> std::optional<int>, with `program` as argv[0].
template <class Options, class ParseFn>
Parsed<Options> parse_argv(const char* program, ParseFn parse, std::vector<const char*> args) {
  args.insert(args.begin(), program);
  Parsed<Options> p;
  p.rc = parse(static_cast<int>(args.size()), const_cast<char**>(args.data()), &p.o, &p.message);
  return p;
}

// A usage error (exit 2) whose one-line message contains `want`.
template <class Options>
void check_refused(const Parsed<Options>& p, const std::string& want) {
  CAPTURE(p.message);
  REQUIRE(p.rc.has_value());
  CHECK(*p.rc == 2);
  CHECK(p.message.find(want) != std::string::npos);
}

}  // namespace xpack::test
