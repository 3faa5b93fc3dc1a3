// The sampler (examples/xpack-run/sampling.cpp) on hand-computed distributions,
// and the stop-string scanner (stop_strings.cpp). No model needed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <vector>

#include "sampling.h"
#include "stop_strings.h"

using xrun::Candidate;
using xrun::Candidates;
using xrun::SamplingParams;

namespace {

std::vector<int32_t> ids(Candidates& c) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < c.size(); ++i) out.push_back(c.at(i).id);
  return out;
}

// Probabilities {4, 2, 1, 1}/8 on ids {3, 1, 0, 2}, given in id order: exact in
// binary, so the boundaries below are exact too.
Candidates eighths() { return Candidates({{0, 1.0}, {1, 2.0}, {2, 1.0}, {3, 4.0}}); }

std::string refused(SamplingParams p) {
  std::string why = xrun::check_sampling_params(p);
  CHECK_THROWS_AS(xrun::Sampler{p}, std::invalid_argument);
  return why;
}

}  // namespace

TEST_CASE("argmax: the first maximum wins") {
  const float l[] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9f};
  CHECK(xrun::argmax(l, 5) == 1);
  const float flat[] = {0.5f, 0.5f, 0.5f};
  CHECK(xrun::argmax(flat, 3) == 0);
}

TEST_CASE("argmax: the plain scan's answer on long rows with ties, NaNs, signed zeros, infinities and tails") {
  const auto scan = [](const std::vector<float>& l) {
    int32_t best = 0;
    for (int i = 1; i < int(l.size()); ++i)
      if (l[size_t(i)] > l[size_t(best)]) best = i;
    return best;
  };
  const float nan = std::nanf(""), inf = INFINITY;
  uint32_t state = 12345;
  const auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  int checked = 0;
  for (int n : {1, 2, 15, 16, 17, 31, 33, 100, 129280}) {
    for (int variant = 0; variant < 12; ++variant) {
      std::vector<float> l(static_cast<size_t>(n), 0.0f);
      // Few distinct values, so ties are common.
      for (float& v : l) v = float(int(next() % 7) - 3) * 0.5f;
      if (variant % 2 == 1) l[next() % size_t(n)] = nan;
      if (variant % 3 == 1) l[0] = nan;
      if (variant % 4 == 2) l[next() % size_t(n)] = inf;
      if (variant % 4 == 3) std::fill(l.begin(), l.end(), -inf);
      if (variant == 5 || variant == 10) {  // zeros of both signs as the maximum
        for (float& v : l) v = v > 0 ? -1.0f : v;
        l[next() % size_t(n)] = -0.0f;
        l[next() % size_t(n)] = 0.0f;
      }
      if (variant == 11) std::fill(l.begin(), l.end(), nan);
      CAPTURE(n);
      CAPTURE(variant);
      CHECK(xrun::argmax(l.data(), n) == scan(l));
      ++checked;
    }
  }
  CHECK(checked == 9 * 12);
  const float one_nan_first[] = {nan, 5.0f, 6.0f};
  CHECK(xrun::argmax(one_nan_first, 3) == 0);
  const float later_max[] = {-0.0f, 0.0f, -1.0f};
  CHECK(xrun::argmax(later_max, 3) == 0);
}

TEST_CASE("greedy: temperature 0 is the argmax of the row, ties to the lowest id, whatever the seed") {
  const float l[] = {-1.0f, 7.0f, 7.0f, 6.5f};
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    SamplingParams p;
    p.seed = seed;
    p.top_k = 3;  // filters do not matter when greedy
    p.top_p = 0.1f;
    xrun::Sampler s(p);
    for (int i = 0; i < 5; ++i) CHECK(s.sample(l, 4) == 1);
  }
}

TEST_CASE("candidates: probabilities in proportion exp(logit / T), most probable first, ties by id") {
  const float l[] = {0.0f, std::log(2.0f), std::log(4.0f), 0.0f};
  Candidates c(l, 4, 1.0f);
  CHECK(ids(c) == std::vector<int32_t>{2, 1, 0, 3});
  CHECK(c.at(0).p == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(c.at(1).p / c.at(0).p == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(c.at(2).p / c.at(0).p == doctest::Approx(0.25).epsilon(1e-6));
  CHECK(c.at(2).p == c.at(3).p);
  CHECK(c.mass() == c.at(0).p + c.at(1).p + c.at(2).p + c.at(3).p);
  // T = 2 takes the square root of the ratios: 4 : 2 : 1 becomes 2 : sqrt 2 : 1.
  Candidates t2(l, 4, 2.0f);
  CHECK(t2.at(1).p / t2.at(0).p == doctest::Approx(std::sqrt(0.5)).epsilon(1e-6));
  CHECK(t2.at(2).p / t2.at(0).p == doctest::Approx(0.5).epsilon(1e-6));
  // A logit masked to -inf, and a NaN, weigh 0.
  const float masked[] = {-INFINITY, 1.0f, std::nanf("")};
  Candidates m(masked, 3, 1.0f);
  CHECK(m.at(0).id == 1);
  CHECK(m.at(1).p == 0.0);
  CHECK(m.at(2).p == 0.0);
  CHECK(m.mass() == 1.0);
  // Nothing to weigh: every logit -inf, or a +inf one.
  const float none[] = {-INFINITY, -INFINITY}, inf[] = {1.0f, INFINITY};
  CHECK(Candidates(none, 2, 1.0f).mass() == 0.0);
  CHECK(Candidates(inf, 2, 1.0f).mass() == 0.0);
}

TEST_CASE("top-k keeps the k most probable; 0 and k >= n keep all") {
  auto c = eighths();
  c.keep_top_k(2);
  CHECK(ids(c) == std::vector<int32_t>{3, 1});
  CHECK(c.mass() == 6.0);
  c = eighths();
  c.keep_top_k(0);
  CHECK(c.size() == 4);
  c.keep_top_k(9);
  CHECK(c.size() == 4);
  CHECK(c.mass() == 8.0);
}

TEST_CASE("top-p: the smallest prefix reaching p of the mass, cut exactly at the boundary") {
  auto kept = [](double p) {
    auto c = eighths();
    c.keep_top_p(p);
    return c.size();
  };
  CHECK(kept(0.5) == 1);         // 4/8 reaches 0.5 exactly
  CHECK(kept(0.5000001) == 2);
  CHECK(kept(0.75) == 2);        // 6/8 reaches 0.75 exactly
  CHECK(kept(0.7500001) == 3);
  CHECK(kept(0.875) == 3);
  CHECK(kept(0.9) == 4);
  CHECK(kept(1.0) == 4);
  CHECK(kept(0.0) == 1);         // never empty
  // On unnormalised weights the fraction is of their total (what top-k left).
  Candidates c({{5, 30.0}, {6, 10.0}, {7, 1000.0}});
  c.keep_top_k(2);
  c.keep_top_p(0.97);
  CHECK(ids(c) == std::vector<int32_t>{7});
  c = Candidates({{5, 30.0}, {6, 10.0}, {7, 1000.0}});
  c.keep_top_k(2);
  c.keep_top_p(0.98);
  CHECK(ids(c) == std::vector<int32_t>{7, 5});
}

TEST_CASE("min-p: relative to the most probable token, the floor itself kept") {
  auto kept = [](double m) {
    auto c = eighths();
    c.keep_min_p(m);
    return c.size();
  };
  CHECK(kept(0.0) == 4);
  CHECK(kept(0.25) == 4);   // floor 1/8: the two 1/8 tokens stay
  CHECK(kept(0.26) == 2);
  CHECK(kept(0.5) == 2);    // floor 2/8: token 1 stays
  CHECK(kept(0.51) == 1);
  CHECK(kept(1.0) == 1);
  // Scale-free: the same on weights times 1000.
  Candidates c({{0, 4000.0}, {1, 2000.0}, {2, 1000.0}});
  c.keep_min_p(0.5);
  CHECK(ids(c) == std::vector<int32_t>{0, 1});
}

TEST_CASE("pick: inverse CDF most probable first; the last survivor takes rounding slack") {
  auto c = eighths();  // 3: [0, 4), 1: [4, 6), 0: [6, 7), 2: [7, 8)
  CHECK(c.pick(0.0) == 3);
  CHECK(c.pick(3.999) == 3);
  CHECK(c.pick(4.0) == 1);
  CHECK(c.pick(6.5) == 0);
  CHECK(c.pick(7.0) == 2);
  CHECK(c.pick(8.5) == 2);
  c.keep_top_k(2);
  CHECK(c.pick(7.0) == 1);
}

namespace {

// The chain as a full sort would run it: every candidate sorted by p (ties by
// id), each filter a prefix, the draw walking the survivors in order.
struct Reference {
  std::vector<Candidate> c;
  double total = 0;  // in id order, as Candidates sums an uncut set
  Reference(const std::vector<float>& l, float t) {
    float mx = -INFINITY;
    for (float v : l) mx = v > mx ? v : mx;
    for (size_t i = 0; i < l.size(); ++i) {
      const double p = std::exp(static_cast<double>(l[i] - mx) / t);
      c.push_back({int32_t(i), std::isnan(p) ? 0.0 : p});
      total += c.back().p;
    }
    std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
      return a.p > b.p || (a.p == b.p && a.id < b.id);
    });
  }
  double mass(size_t n) const {
    if (n == c.size()) return total;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += c[i].p;
    return s;
  }
  size_t survivors(const SamplingParams& p) const {
    size_t n = p.top_k > 0 ? std::min(c.size(), size_t(p.top_k)) : c.size();
    if (p.top_p < 1.0f) {
      const double target = double(p.top_p) * mass(n);
      double cum = 0;
      size_t keep = 0;
      while (keep < n) {
        cum += c[keep++].p;
        if (cum >= target) break;
      }
      n = std::max<size_t>(keep, 1);
    }
    if (p.min_p > 0.0f) {
      size_t keep = 1;
      while (keep < n && c[keep].p >= double(p.min_p) * c[0].p) ++keep;
      n = keep;
    }
    return n;
  }
};

}  // namespace

TEST_CASE("candidates on long rows: the survivors and draws of a full sort, filter by filter") {
  uint32_t state = 777;
  const auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  const auto uniform = [&] { return double(next()) / double(1u << 24); };
  for (int n : {1, 5, 64, 65, 300, 5000, 129280}) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> l(static_cast<size_t>(n));
      // Variant 0 peaked (a few large logits), 1 flat with ties, 2 wide, 3 with -inf and NaN.
      for (float& v : l) {
        const double u = uniform();
        v = variant == 1 ? float(int(u * 5)) * 0.25f : float((u - 0.5) * (variant == 0 ? 8 : 30));
      }
      if (variant == 0)
        for (int k = 0; k < 3; ++k) l[next() % size_t(n)] = 20.0f + float(k);
      if (variant == 3)
        for (int k = 0; k < n / 10; ++k) l[next() % size_t(n)] = k % 2 ? -INFINITY : std::nanf("");
      for (float t : {0.3f, 1.0f, 2.5f}) {
        const Reference ref(l, t);
        struct Filters {
          int top_k;
          float top_p, min_p;
        };
        for (const Filters f : {Filters{0, 1.0f, 0.0f}, Filters{40, 1.0f, 0.0f}, Filters{0, 0.9f, 0.0f},
                                Filters{0, 0.999f, 0.0f}, Filters{50, 0.95f, 0.05f}, Filters{0, 1.0f, 0.01f},
                                Filters{1, 0.5f, 0.0f}, Filters{100000, 0.2f, 0.5f}}) {
          SamplingParams p;
          p.temperature = t;
          p.top_k = f.top_k;
          p.top_p = f.top_p;
          p.min_p = f.min_p;
          Candidates c(l.data(), n, t);
          c.keep_top_k(p.top_k);
          c.keep_top_p(p.top_p);
          c.keep_min_p(p.min_p);
          const size_t m = ref.survivors(p);
          CAPTURE(n);
          CAPTURE(variant);
          CAPTURE(t);
          CAPTURE(f.top_k);
          CAPTURE(f.top_p);
          CAPTURE(f.min_p);
          REQUIRE(c.size() == m);
          CHECK(c.mass() == ref.mass(m));
          // Draws anywhere in the mass, the edges included, land where the sorted walk does.
          for (double frac : {0.0, 1e-9, 0.3, uniform(), uniform(), 0.999999, 1.0}) {
            double u = frac * ref.mass(m);
            int32_t want = ref.c[m - 1].id;
            for (size_t i = 0; i < m; ++i) {
              if (u < ref.c[i].p) {
                want = ref.c[i].id;
                break;
              }
              u -= ref.c[i].p;
            }
            CHECK(c.pick(frac * ref.mass(m)) == want);
          }
          // Every survivor, in order, as the sort has them (the walk above may have looked at a few).
          bool same = true;
          for (size_t i = 0; i < m; ++i) same = same && c.at(i).id == ref.c[i].id && c.at(i).p == ref.c[i].p;
          CHECK(same);
        }
      }
    }
  }
}

TEST_CASE("penalties on the logits: repeat divides positive, multiplies negative; frequency x count; presence once") {
  SamplingParams p;
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  float l[] = {2.0f, -2.0f, 1.0f, 0.5f};
  std::deque<int32_t> window = {0, 1, 1, 3, 77, -4};  // out-of-vocabulary ids are ignored
  xrun::apply_penalties(l, 4, window, p);
  CHECK(l[0] == 2.0f / 2 - (1 * 0.5f + 0.25f));   // 0.25
  CHECK(l[1] == -2.0f * 2 - (2 * 0.5f + 0.25f));  // -5.25
  CHECK(l[2] == 1.0f);                            // not in the window
  CHECK(l[3] == 0.5f / 2 - (1 * 0.5f + 0.25f));   // -0.5
  // Negative frequency/presence values raise the tokens (OpenAI's range allows it).
  SamplingParams up;
  up.presence_penalty = -1.0f;
  float m[] = {0.0f, 0.0f};
  xrun::apply_penalties(m, 2, {1}, up);
  CHECK(m[1] == 1.0f);
  CHECK(m[0] == 0.0f);
}

TEST_CASE("penalty window: the last N accepted tokens, prompt included; -1 = all, 0 = off") {
  const float l[] = {3.0f, 2.0f, 1.5f};
  SamplingParams p;
  p.presence_penalty = 2.0f;  // 3 -> 1, 2 -> 0 for a token in the window
  p.penalty_last_n = 1;
  xrun::Sampler s(p);
  s.accept(0);
  CHECK(s.sample(l, 3) == 1);  // {1, 2, 1.5}
  s.accept(1);                 // the window slides: only token 1 now
  CHECK(s.sample(l, 3) == 0);  // {3, 0, 1.5}
  p.penalty_last_n = -1;
  xrun::Sampler all(p);
  all.accept(0);
  all.accept(1);
  CHECK(all.sample(l, 3) == 2);  // {1, 0, 1.5}
  all.clear_history();
  CHECK(all.sample(l, 3) == 0);  // no penalty left
  p.penalty_last_n = 0;
  xrun::Sampler off(p);
  off.accept(0);
  CHECK(off.sample(l, 3) == 0);
  // The row passed in is not modified.
  CHECK(l[0] == 3.0f);
}

TEST_CASE("a seeded draw is reproducible and follows the distribution") {
  const float l[] = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  xrun::Sampler a(p), b(p);
  p.seed = 1235;
  xrun::Sampler c(p);
  std::vector<int32_t> da, db, dc;
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    da.push_back(a.sample(l, 2));
    db.push_back(b.sample(l, 2));
    dc.push_back(c.sample(l, 2));
    ones += da.back();
  }
  CHECK(da == db);
  CHECK(da != dc);
  // Binomial(20000, 0.75): sd 61; 0.02 x 20000 = 400 is 6.5 sd.
  CHECK(std::abs(double(ones) / n - 0.75) < 0.02);
}

TEST_CASE("filters decide what a draw may return") {
  const float l[] = {1.0f, 1.1f, 0.9f, 1.05f};
  SamplingParams p;
  p.temperature = 50.0f;  // nearly flat
  p.seed = 7;
  p.top_k = 1;
  xrun::Sampler k1(p);
  for (int i = 0; i < 200; ++i) CHECK(k1.sample(l, 4) == 1);
  p.top_k = 2;
  xrun::Sampler k2(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[k2.sample(l, 4)];
  CHECK(seen.size() == 2);
  CHECK(seen.count(1) == 1);
  CHECK(seen.count(3) == 1);
  p.top_k = 0;
  p.min_p = 1.0f;
  xrun::Sampler m1(p);
  for (int i = 0; i < 200; ++i) CHECK(m1.sample(l, 4) == 1);
  // At a low temperature top-p 0.5 leaves only the top token.
  p.min_p = 0.0f;
  p.temperature = 0.01f;
  p.top_p = 0.5f;
  xrun::Sampler tp(p);
  for (int i = 0; i < 200; ++i) CHECK(tp.sample(l, 4) == 1);
}

TEST_CASE("invalid sampling values are refused, naming the flag") {
  SamplingParams ok;
  CHECK(xrun::check_sampling_params(ok).empty());
  SamplingParams p;
  p.top_p = -0.1f;
  CHECK(refused(p).find("--top-p must be in [0, 1]") != std::string::npos);
  p = ok;
  p.top_p = 1.5f;
  CHECK(refused(p).find("--top-p") != std::string::npos);
  p = ok;
  p.top_k = -1;
  CHECK(refused(p).find("--top-k must be >= 0") != std::string::npos);
  p = ok;
  p.temperature = -1.0f;
  CHECK(refused(p).find("--temp") != std::string::npos);
  p = ok;
  p.temperature = NAN;
  CHECK(refused(p).find("--temp") != std::string::npos);
  p = ok;
  p.min_p = 2.0f;
  CHECK(refused(p).find("--min-p") != std::string::npos);
  p = ok;
  p.repeat_penalty = 0.0f;
  CHECK(refused(p).find("--repeat-penalty must be a finite number > 0") != std::string::npos);
  p = ok;
  p.presence_penalty = 2.5f;
  CHECK(refused(p).find("--presence-penalty must be in [-2, 2]") != std::string::npos);
  p = ok;
  p.frequency_penalty = -3.0f;
  CHECK(refused(p).find("--frequency-penalty") != std::string::npos);
  p = ok;
  p.penalty_last_n = -2;
  CHECK(refused(p).find("--repeat-last-n must be >= -1") != std::string::npos);
}

TEST_CASE("stop strings: the text ends before the first stop string, across token boundaries") {
  auto run = [](std::vector<std::string> stops, std::vector<std::string> pieces, bool* stopped = nullptr) {
    xrun::StopScanner s(std::move(stops));
    std::string out;
    for (const auto& p : pieces) out += s.feed(p);
    if (stopped) *stopped = s.stopped();
    return out + s.flush();
  };
  bool stopped = false;
  CHECK(run({"STOP"}, {"Hello wor", "ld! STOP here", "more"}, &stopped) == "Hello world! ");
  CHECK(stopped);
  CHECK(run({"STOP"}, {"ab", "cS", "TO", "Pxyz"}, &stopped) == "abc");
  CHECK(stopped);
  CHECK(run({"STOP"}, {"xS", "Q", "ST"}, &stopped) == "xSQST");  // held back, then released at the end
  CHECK(!stopped);
  CHECK(run({"world", "lo"}, {"hello world"}) == "hel");  // the earliest match wins
  CHECK(run({"\n\n"}, {"line\n", "\nnext"}) == "line");
  CHECK(run({}, {"a", "b"}) == "ab");

  // What feed() releases is final: a held-back tail is not printed early.
  xrun::StopScanner s({"</s>"});
  CHECK(s.feed("hi <") == "hi ");
  CHECK(s.feed("/") == "");
  CHECK(s.feed("x") == "</x");
  CHECK(s.feed("</s") == "");
  CHECK(s.feed(">tail") == "");
  CHECK(s.stopped());
  CHECK(s.feed("later") == "");
  CHECK(s.flush() == "");

  CHECK(xrun::check_stop_strings({"a", ""}).find("empty stop string") != std::string::npos);
  CHECK(xrun::check_stop_strings({"a", "bc"}).empty());
}

TEST_CASE("random_seed: within --seed's range, and not constant") {
  const uint64_t a = xrun::random_seed(), b = xrun::random_seed(), c = xrun::random_seed();
  for (uint64_t s : {a, b, c}) CHECK(s <= uint64_t{INT64_MAX});
  CHECK(!(a == b && b == c));  // three equal 63-bit draws: the device is not random
}
