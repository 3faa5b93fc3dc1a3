// Unit tests of the engine's parts: read_splits, the latency histogram, the
// memlock decision, the staging arena.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include "io/alignment.h"
#include "common/latency_histogram.h"
#include "io/memlock.h"
#include "io/read_splits.h"
#include "io/staging_arena.h"

using namespace xpack;
using namespace xpack::io;

static void check_cover(const std::vector<ReadRange>& r, uint64_t length, uint64_t boundary) {
  uint64_t pos = 0;
  for (const auto& x : r) {
    CHECK(x.offset == pos);
    CHECK(x.length > 0);
    CHECK(io_aligned(x.offset));
    CHECK(io_aligned(x.length));
    if (boundary) CHECK(x.offset / boundary == (x.offset + x.length - 1) / boundary);
    pos += x.length;
  }
  CHECK(pos == length);
}

TEST_CASE("split_read covers the read with aligned ranges") {
  for (uint64_t pages : {1, 2, 3, 5, 7, 64, 1000, 3265}) {
    for (uint32_t k : {1u, 2u, 3u, 4u, 7u, 16u}) {
      uint64_t len = pages * kDirectIoAlign;
      auto r = split_read(len, k);
      CHECK(r.size() == std::min<uint64_t>(k, pages));
      check_cover(r, len, 0);
    }
  }
  // The DeepSeek object from the reference: 13,369,344 bytes in 4 ranges.
  auto r = split_read(13369344, 4);
  REQUIRE(r.size() == 4);
  CHECK(r[1].offset == 3342336);
  check_cover(r, 13369344, 0);
}

TEST_CASE("split_read cuts ranges at registered-buffer boundaries") {
  const uint64_t boundary = 16 * kDirectIoAlign;
  auto r = split_read(40 * kDirectIoAlign, 3, boundary);
  check_cover(r, 40 * kDirectIoAlign, boundary);
  CHECK(r.size() >= 3);
  auto big = split_read(3ull << 30, 2, kMaxRegisteredBuffer);  // 3 GiB, 2 splits
  check_cover(big, 3ull << 30, kMaxRegisteredBuffer);
  CHECK(big.size() == 4);  // [0,1G) [1G,1.5G) [1.5G,2G) [2G,3G)
}

TEST_CASE("split_read with hostile sizes") {
  CHECK(split_read(0, 4).empty());
  CHECK(split_read(4096, 0).empty());
  auto r = split_read(UINT64_MAX / 4096 * 4096, 256);
  CHECK(r.size() == 256);
  check_cover(r, UINT64_MAX / 4096 * 4096, 0);
}

TEST_CASE("latency histogram quantiles") {
  LatencyHistogram h;
  CHECK(h.quantile_ns(0.5) == 0);
  for (int i = 0; i < 990; ++i) h.record(100000);      // 100 us
  for (int i = 0; i < 9; ++i) h.record(5000000);       // 5 ms
  h.record(80000000);                                  // 80 ms
  CHECK(h.count() == 1000);
  uint64_t p50 = h.quantile_ns(0.5), p99 = h.quantile_ns(0.99), p999 = h.quantile_ns(0.999),
           pmax = h.quantile_ns(1.0);
  CHECK(p50 >= 100000);
  CHECK(p50 < 100000 * 1.0625);
  CHECK(p99 == p50);  // 990 of 1000 samples are 100 us
  CHECK(p999 >= 5000000);
  CHECK(p999 < 5000000 * 1.0625);
  CHECK(pmax >= 80000000);
  CHECK(pmax < 80000000 * 1.0625);
  auto log2 = h.log2_counts();
  CHECK(log2[16] == 990);  // 2^16 = 65536 <= 100000 < 131072
  LatencyHistogram other;
  other.record(1);
  h.merge(other);
  CHECK(h.count() == 1001);
  CHECK(h.quantile_ns(0.0001) == 1);
  h.record(UINT64_MAX);  // must not overflow a bucket index
  CHECK(h.quantile_ns(1.0) == UINT64_MAX);
}

TEST_CASE("memlock decisions") {
  const uint64_t need = 64ull << 20;
  CHECK(plan_memlock(need, 8 << 20, 8 << 20, true) == MemlockAction::kNothing);
  CHECK(plan_memlock(need, RLIM_INFINITY, RLIM_INFINITY, false) == MemlockAction::kNothing);
  CHECK(plan_memlock(need, need, need, false) == MemlockAction::kNothing);
  CHECK(plan_memlock(need, 8 << 20, RLIM_INFINITY, false) == MemlockAction::kRaiseSoft);
  CHECK(plan_memlock(need, 8 << 20, need * 2, false) == MemlockAction::kRaiseSoft);
  CHECK(plan_memlock(need, 8 << 20, 16 << 20, false) == MemlockAction::kInsufficient);
  std::string advice = memlock_advice(need, 8 << 20, 16 << 20);
  CHECK(advice.find("ulimit -l") != std::string::npos);
  CHECK(advice.find(std::to_string(need)) != std::string::npos);
}

TEST_CASE("ensure_memlock succeeds for small amounts") {
  CHECK(ensure_memlock(4096).ok());
}

namespace {
struct RecordingRegistrar : HostMemoryRegistrar {
  void* base = nullptr;
  size_t bytes = 0;
  int unregistered = 0;
  bool fail = false;
  Status register_host(void* b, size_t n) override {
    if (fail) return err(XPACK_E_DEVICE, "refused");
    base = b;
    bytes = n;
    return {};
  }
  void unregister_host(void* b) override {
    CHECK(b == base);
    ++unregistered;
  }
};
}  // namespace

TEST_CASE("staging arena layout") {
  ArenaConfig c;
  c.slot_count = 5;
  c.slot_bytes = 10000;  // rounded up to 12288
  auto a = StagingArena::create(c);
  REQUIRE(a.ok());
  auto& arena = **a;
  CHECK(arena.slot_bytes() == 12288);
  CHECK(arena.total_bytes() == 5 * 12288);
  CHECK(arena.iovecs().size() == 5);
  for (uint32_t i = 0; i < 5; ++i) {
    CHECK(io_aligned(arena.slot(i)));
    CHECK(arena.iovecs()[i].iov_base == arena.slot(i));
    CHECK(arena.buffer_index(arena.slot(i), 12288) == static_cast<int>(i));
    arena.slot(i)[0] = static_cast<uint8_t>(i);  // writable
  }
  CHECK(arena.buffer_index(arena.slot(1) + 4096, 12288) == -1);  // crosses into slot 2
  CHECK(arena.buffer_index(arena.base() - 1, 1) == -1);
  CHECK(arena.buffer_index(arena.slot(4), 12289) == -1);
  // Under 2 MiB the arena is not rounded up for huge pages (it would multiply it).
  CHECK(!arena.huge_wanted());
  CHECK(arena.mapped_bytes() == 5 * 12288);
  CHECK(arena.page_source() == PageSource::kSmall);
  CHECK(arena.page_bytes() == 4096);  // measured in /proc/self/smaps
}

TEST_CASE("staging arena: huge-page rounding respects the size limit") {
  ArenaConfig c;
  c.slot_count = 3;
  c.slot_bytes = 1u << 20;
  c.max_total_bytes = 3u << 20;  // 3 MiB fits, its 4 MiB rounding does not
  auto a = StagingArena::create(c);
  REQUIRE(a.ok());
  CHECK(!(*a)->huge_wanted());
  CHECK((*a)->mapped_bytes() == (3u << 20));
  CHECK((*a)->page_source() == PageSource::kSmall);
  CHECK((*a)->page_description().find("limit") != std::string::npos);
  c.max_total_bytes = (3u << 20) - 1;  // the request itself is over: refused
  CHECK(StagingArena::create(c).error().code == XPACK_E_LIMIT);
  // A slot size whose 2 MiB rounding would overflow is refused, not wrapped.
  c.max_total_bytes = UINT64_MAX;
  c.slot_count = 1;
  c.slot_bytes = UINT64_MAX - (1u << 20);
  auto big = StagingArena::create(c);
  CHECK(!big.ok());
}

TEST_CASE("staging arena registrar hook") {
  RecordingRegistrar reg;
  {
    ArenaConfig c;
    c.slot_count = 2;
    c.slot_bytes = 4096;
    auto a = StagingArena::create(c);
    REQUIRE(a.ok());
    REQUIRE((*a)->attach_registrar(&reg).ok());
    CHECK(reg.base == (*a)->base());
    CHECK(reg.bytes == 8192);
    CHECK(!(*a)->attach_registrar(&reg).ok());  // only one
  }
  CHECK(reg.unregistered == 1);
  RecordingRegistrar failing;
  failing.fail = true;
  ArenaConfig c;
  c.slot_count = 1;
  c.slot_bytes = 4096;
  auto a = StagingArena::create(c);
  REQUIRE(a.ok());
  auto st = (*a)->attach_registrar(&failing);
  CHECK(st.error().code == XPACK_E_DEVICE);
}

TEST_CASE("staging arena rejects hostile configurations") {
  ArenaConfig c;
  c.slot_count = 0;
  c.slot_bytes = 4096;
  CHECK(StagingArena::create(c).error().code == XPACK_E_INVALID_ARG);
  c.slot_count = 4;
  c.slot_bytes = 0;
  CHECK(StagingArena::create(c).error().code == XPACK_E_INVALID_ARG);
  c.slot_bytes = UINT64_MAX - 10;  // rounding overflows
  CHECK(StagingArena::create(c).error().code == XPACK_E_LIMIT);
  c.slot_count = 0xFFFFFFFF;
  c.slot_bytes = 1ull << 40;  // product overflows
  CHECK(StagingArena::create(c).error().code == XPACK_E_LIMIT);
  c.slot_count = 2;
  c.slot_bytes = 4096;
  c.numa_node = 4000;
  auto r = StagingArena::create(c);
  CHECK(!r.ok());
}

TEST_CASE("staging arena on NUMA node 0") {
  ArenaConfig c;
  c.slot_count = 3;
  c.slot_bytes = 65536;
  c.numa_node = 0;
  auto a = StagingArena::create(c);
  if (!a.ok()) {
    MESSAGE("NUMA not available here: " << a.error().message);
    CHECK(a.error().code == XPACK_E_UNSUPPORTED);
    return;
  }
  CHECK((*a)->slot(2)[65535] == 0);
}
