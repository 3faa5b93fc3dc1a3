// Staging memory in 2 MiB pages: where transparent huge pages are enabled
// (madvise or always) or hugetlb pages are reserved, an arena of a few MiB must
// come out huge-page backed (a 1 MiB read into 4 KiB pages is 256 segments, above
// NVMe's max_segments, and gets split), and the engine must read correctly into
// it with registered buffers. Skipped (77) where the kernel offers no huge pages.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>

#include "io/huge_pages.h"
#include "io/read_engine.h"
#include "io/staging_arena.h"
#include "io_test_util.h"

using namespace xpack;
using namespace xpack::io;
using xpack::test::TempDir;

namespace {

// Exits 77 (meson SKIP) with the reason when this kernel cannot give huge pages.
void require_huge_pages() {
  ThpMode m = thp_mode();
  bool thp = (m == ThpMode::kAlways || m == ThpMode::kMadvise) && thp_page_bytes() == kHugePageBytes;
  if (thp || hugetlb_free_pages(kHugePageBytes) >= 4) return;
  std::printf("SKIP: transparent huge pages are '%s' (need madvise or always, 2 MiB) and no "
              "hugetlb pages are free\n",
              thp_mode_name(m));
  std::exit(77);
}

}  // namespace

TEST_CASE("an arena of a few MiB is backed by 2 MiB pages") {
  require_huge_pages();
  ArenaConfig c;
  c.slot_count = 3;
  c.slot_bytes = (1u << 20) + 4096;  // 3 x 1 MiB + 4 KiB: the mapping rounds to 4 MiB
  auto a = StagingArena::create(c);
  REQUIRE(a.ok());
  StagingArena& arena = **a;
  MESSAGE("staging: " << arena.page_description());
  CHECK(arena.huge_wanted());
  CHECK(arena.page_bytes() == kHugePageBytes);
  CHECK(arena.huge_fraction() >= 0.5);
  CHECK(arena.page_source() != PageSource::kSmall);
  CHECK(reinterpret_cast<uintptr_t>(arena.base()) % kHugePageBytes == 0);
  CHECK(arena.slot_bytes() == (1u << 20) + 4096);  // slots are not rounded to 2 MiB
  CHECK(arena.total_bytes() == 3 * arena.slot_bytes());
  CHECK(arena.mapped_bytes() == (4u << 20));
  REQUIRE(arena.iovecs().size() == 3);
  for (uint32_t i = 0; i < 3; ++i) {
    CHECK(arena.iovecs()[i].iov_base == arena.slot(i));
    CHECK(arena.buffer_index(arena.slot(i), arena.slot_bytes()) == static_cast<int>(i));
    arena.slot(i)[arena.slot_bytes() - 1] = 1;  // the whole slot is writable
  }
  CHECK(arena.buffer_index(arena.slot(2), arena.slot_bytes() + 4096) == -1);  // past the slots
  CHECK(arena.buffer_index(arena.slot(0) + 4096, arena.slot_bytes()) == -1);  // crosses slots
}

TEST_CASE("forced small pages stay small where huge pages are available") {
  require_huge_pages();
  ArenaConfig c;
  c.slot_count = 4;
  c.slot_bytes = 1u << 20;
  c.huge_pages = false;
  auto a = StagingArena::create(c);
  REQUIRE(a.ok());
  MESSAGE("staging: " << (*a)->page_description());
  CHECK(!(*a)->huge_wanted());
  CHECK((*a)->page_source() == PageSource::kSmall);
  CHECK((*a)->page_bytes() == 4096);
  CHECK((*a)->huge_fraction() == 0.0);  // MADV_NOHUGEPAGE even under THP "always"
  CHECK((*a)->mapped_bytes() == (4u << 20));
}

TEST_CASE("huge pages with a NUMA binding") {
  require_huge_pages();
  ArenaConfig c;
  c.slot_count = 2;
  c.slot_bytes = 2u << 20;
  c.numa_node = 0;
  auto a = StagingArena::create(c);
  if (!a.ok()) {
    MESSAGE("NUMA not available here: " << a.error().message);
    CHECK(a.error().code == XPACK_E_UNSUPPORTED);
    return;
  }
  MESSAGE("staging on node 0: " << (*a)->page_description());
  CHECK((*a)->page_bytes() == kHugePageBytes);
  CHECK((*a)->slot(1)[(2u << 20) - 1] == 0);
}

TEST_CASE("the engine reads correctly into huge-page staging with registered buffers") {
  require_huge_pages();
  TempDir dir;
  const uint64_t obj = 1u << 20;
  auto file = xpack::test::make_pattern_file(dir, "objects.bin", 8 * obj);
  EngineConfig c;
  c.paths = {file.string()};
  c.slot_count = 4;
  c.slot_bytes = obj;
  c.queue_depth = 8;
  c.read_splits = 2;
  auto e = ReadEngine::create(c);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  ReadEngine& engine = **e;
  CHECK(engine.arena().page_bytes() == kHugePageBytes);
  for (uint32_t round = 0; round < 2; ++round) {
    std::vector<ReadRequest> batch;
    for (uint32_t s = 0; s < 4; ++s) batch.push_back({0, (round * 4 + s) * obj, obj, s, s});
    REQUIRE(engine.submit(batch).ok());
    std::vector<Completion> done;
    while (done.size() < 4) {
      auto r = engine.poll(5000, &done);
      REQUIRE(r.ok());
      REQUIRE(*r > 0);
    }
    for (const auto& d : done) {
      CHECK(d.status == 0);
      CHECK(xpack::test::matches_pattern(engine.slot_data(d.slot), (round * 4 + d.slot) * obj, obj));
    }
  }
}
