// The server's admission gate (server_gate.cpp) under many threads (run it
// under TSan: DEVELOPERS.md), and the /metrics page (server_metrics.cpp).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_gate.h"
#include "server_metrics.h"

using xrun::RequestGate;

TEST_CASE("gate: one runs, max_waiting wait, one more is refused") {
  RequestGate gate(2);
  auto a = gate.try_enter();
  REQUIRE(a);
  REQUIRE(a->wait());
  auto b = gate.try_enter();
  auto c = gate.try_enter();
  REQUIRE(b);
  REQUIRE(c);
  CHECK(gate.counts().waiting == 2);
  CHECK(gate.counts().running);
  CHECK(!gate.try_enter());
  CHECK(gate.counts().rejected == 1);
  // A waiter that leaves before its turn frees its place without running.
  b.reset();
  CHECK(gate.counts().waiting == 1);
  auto d = gate.try_enter();
  REQUIRE(d);
  a.reset();
  REQUIRE(c->wait());
  c.reset();
  REQUIRE(d->wait());
  d.reset();
  CHECK(!gate.counts().running);
  CHECK(gate.counts().waiting == 0);
}

TEST_CASE("gate: max_waiting 0 admits one at a time and nothing waits") {
  RequestGate gate(0);
  auto a = gate.try_enter();
  REQUIRE(a);
  CHECK(!gate.try_enter());  // even before a waits: its place is taken
  REQUIRE(a->wait());
  CHECK(!gate.try_enter());
  a.reset();
  CHECK(gate.try_enter());
}

TEST_CASE("gate: 16 threads, never two running, every admitted one runs") {
  RequestGate gate(64);
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  std::atomic<int> ran{0};
  std::atomic<int> refused_waits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto turn = gate.try_enter();
        if (!turn) continue;
        if (!turn->wait()) {
          ++refused_waits;  // asserted below: doctest's checks stay on the main thread
          continue;
        }
        const int now = ++inside;
        int seen = max_inside.load();
        while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
        }
        ++ran;
        --inside;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(refused_waits.load() == 0);
  CHECK(max_inside.load() == 1);
  CHECK(ran.load() == 16 * 50);  // 64 places: nobody was refused
  CHECK(gate.counts().rejected == 0);
}

TEST_CASE("gate: waiters run in the order they entered, whatever order they wait in") {
  RequestGate gate(8);
  auto first = gate.try_enter();
  REQUIRE(first->wait());
  std::vector<std::optional<RequestGate::Turn>> turns;
  for (int i = 0; i < 4; ++i) turns.push_back(gate.try_enter());
  std::mutex m;
  std::vector<int> order;
  std::vector<std::thread> threads;
  for (int i = 3; i >= 0; --i)  // the last to enter starts waiting first
    threads.emplace_back([&, i] {
      if (!turns[static_cast<size_t>(i)]->wait()) return;
      {
        std::lock_guard<std::mutex> lock(m);
        order.push_back(i);
      }
      turns[static_cast<size_t>(i)].reset();
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  first.reset();
  for (auto& t : threads) t.join();
  CHECK(order == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("gate: close wakes every waiter with false") {
  RequestGate gate(4);
  auto running = gate.try_enter();
  REQUIRE(running->wait());
  std::atomic<int> woke_false{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i)
    waiters.emplace_back([&] {
      auto t = gate.try_enter();
      if (t && !t->wait()) ++woke_false;
    });
  while (gate.counts().waiting < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gate.close();
  for (auto& w : waiters) w.join();
  CHECK(woke_false.load() == 3);
  CHECK(!gate.try_enter());
}

TEST_CASE("metrics: Prometheus text with the engine's counters, per tier where present") {
  xrun::ServerMetrics m;
  m.count_response("completions", 200);
  m.count_response("completions", 400);
  m.count_response("completions", 400);
  xrun::GenerationStats s;
  s.prompt_tokens = 10;
  s.reused_tokens = 2;
  s.completion_tokens = 4;
  s.prefill_s = 0.5;
  s.decode_s = 2.0;
  m.count_generation(s, false);
  m.count_generation(s, true);
  nlohmann::ordered_json c = {{"source", "pack-cache"}, {"cache_hits", 7}, {"cache_misses", 3}, {"pack_read_bytes", 4096},
                              {"h2d_bytes", 0}, {"budget_objects", 5},
                              {"tiers", {{"gpu", {{"cache_hits", 5}}}, {"host", {{"cache_hits", 2}}}}}};
  m.set_engine_counters(c);
  RequestGate gate(1);
  const std::string page = m.render(gate.counts());
  auto has = [&](const std::string& line) {
    CAPTURE(line);
    CHECK(page.find(line + "\n") != std::string::npos);
  };
  has("xpack_server_responses_total{endpoint=\"completions\",code=\"400\"} 2");
  has("xpack_server_responses_total{endpoint=\"completions\",code=\"200\"} 1");
  has("xpack_server_generations_total 2");
  has("xpack_server_cancelled_total 1");
  has("xpack_server_prompt_tokens_total 20");
  has("xpack_server_prompt_tokens_reused_total 4");
  has("xpack_server_completion_tokens_total 8");
  has("xpack_server_prefill_tokens_per_second 16");
  has("xpack_server_decode_tokens_per_second 2");
  has("xpack_engine_info{source=\"pack-cache\"} 1");
  has("# TYPE xpack_engine_cache_hits_total counter");
  has("xpack_engine_cache_hits_total 7");
  has("xpack_engine_cache_hits_total{tier=\"gpu\"} 5");
  has("xpack_engine_cache_hits_total{tier=\"host\"} 2");
  has("xpack_engine_pack_read_bytes_total 4096");
  has("# TYPE xpack_engine_budget_objects gauge");
  // Each family's TYPE line appears once, even with several tiers under it.
  size_t n = 0;
  for (size_t at = page.find("# TYPE xpack_engine_cache_hits_total"); at != std::string::npos;
       at = page.find("# TYPE xpack_engine_cache_hits_total", at + 1))
    ++n;
  CHECK(n == 1);
}
