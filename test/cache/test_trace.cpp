// Routing trace CSV: writer/reader round trip and malformed input.
#include <doctest/doctest.h>

#include <string>

#include "fixtures.h"
#include "stats/routing_trace.h"

using namespace xpack;
using namespace xpack::stats;

TEST_CASE("trace: write then read back") {
  test::TempDir dir;
  auto path = (dir / "t.csv").string();
  {
    auto w = RoutingTraceWriter::open(path);
    REQUIRE(w.ok());
    uint32_t e0[] = {3, 7};
    uint32_t e1[] = {4294967295u};
    REQUIRE((*w)->write(0, 1, e0, 2).ok());
    REQUIRE((*w)->write(18446744073709551615ull, 2, e1, 1).ok());
  }
  auto bytes = test::read_file(path);
  CHECK(std::string(bytes.begin(), bytes.end()) ==
        "step,layer,expert\n0,1,3\n0,1,7\n18446744073709551615,2,4294967295\n");
  auto r = read_routing_trace(path);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK((*r)[1].expert == 7);
  CHECK((*r)[2].step == 18446744073709551615ull);
}

TEST_CASE("trace: CRLF and blank lines are accepted") {
  auto r = parse_routing_trace("step,layer,expert\r\n\r\n1,2,3\r\n");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].layer == 2);
}

TEST_CASE("trace: malformed input fails with the line number") {
  CHECK(parse_routing_trace("").error().code == XPACK_E_FORMAT);
  CHECK(parse_routing_trace("1,2,3\n").error().code == XPACK_E_FORMAT);  // no header
  auto e = parse_routing_trace("step,layer,expert\n1,2,3\n1,2\n");
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("line 3") != std::string::npos);
  CHECK_FALSE(parse_routing_trace("step,layer,expert\n1,2,3,4\n").ok());
  CHECK_FALSE(parse_routing_trace("step,layer,expert\n1,-2,3\n").ok());
  CHECK_FALSE(parse_routing_trace("step,layer,expert\n1,x,3\n").ok());
  CHECK_FALSE(parse_routing_trace("step,layer,expert\n99999999999999999999,1,3\n").ok());
  CHECK(parse_routing_trace("step,layer,expert\n1,4294967296,3\n").error().code == XPACK_E_LIMIT);
  CHECK_FALSE(read_routing_trace("/nonexistent/x.csv").ok());
}
