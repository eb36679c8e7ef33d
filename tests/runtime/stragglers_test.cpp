// Naming stragglers from heartbeats: a rank whose compute per step stays >= 10% over the others'
// median for a window of steps and seconds.
#include "runtime/driver/stragglers.h"

#include <gtest/gtest.h>

#include <random>

namespace dsgd::runtime {
namespace {

// `ranks` workers beating once a second, 10 steps a beat, each step computing `compute(rank, t)`
// seconds. Returns every straggler the detector named or cleared, in order.
template <typename Compute>
std::vector<Straggler> run(StragglerDetector& d, int ranks, int seconds, Compute compute) {
  std::vector<double> total(ranks, 0);
  std::vector<Straggler> changes;
  for (int t = 1; t <= seconds; ++t) {
    for (int r = 0; r < ranks; ++r) {
      for (int s = 0; s < 10; ++s) total[r] += compute(r, t);
      d.observe(/*worker=*/r + 100, r, "host" + std::to_string(r), 1000 + r, int64_t{t} * 10, int64_t{t} * 10,
                total[r], t);
    }
    for (const auto& c : d.update()) changes.push_back(c);
  }
  return changes;
}

TEST(Stragglers, ASlowRankIsNamedWithItsSlowdownAndStepsThenCleared) {
  StragglerDetector d;
  // 8 ranks at 50 ms a step; rank 5 at 65 ms (1.3x) from second 30 to second 90.
  const auto changes = run(d, 8, 150, [](int r, int t) { return r == 5 && t > 30 && t <= 90 ? 0.065 : 0.050; });
  ASSERT_EQ(changes.size(), 2u);
  const Straggler& named = changes[0];
  EXPECT_EQ(named.rank, 5);
  EXPECT_EQ(named.host, "host5");
  EXPECT_EQ(named.pid, 1005);
  EXPECT_EQ(named.to_step, -1);
  EXPECT_GE(named.from_step, 200) << "its window began where it was still at pace, at most 10 s before";
  EXPECT_LE(named.from_step, 300);
  EXPECT_EQ(changes[1].rank, 5);
  EXPECT_GT(changes[1].to_step, 900);
  EXPECT_LE(changes[1].to_step, 1000 + 10 * 10);
  const auto all = d.take_named();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_NEAR(all[0].slowdown, 1.3, 0.01);
  EXPECT_EQ(all[0].to_step, changes[1].to_step);
  EXPECT_TRUE(d.current().empty());
}

TEST(Stragglers, NamedWithinTheWindowOfTheSlowdown) {
  StragglerDetector d;
  int named_at = -1;
  std::vector<double> total(4, 0);
  for (int t = 1; t <= 60 && named_at < 0; ++t) {
    for (int r = 0; r < 4; ++r) {
      for (int s = 0; s < 10; ++s) total[r] += r == 2 && t > 20 ? 0.05 * 1.5 : 0.05;
      d.observe(r, r, "h", r, t * 10, t * 10, total[r], t);
    }
    if (!d.update().empty()) named_at = t;
  }
  EXPECT_GT(named_at, 20);
  EXPECT_LE(named_at, 20 + 10) << "a 1.5x slowdown shows within one 10 s window";
  ASSERT_EQ(d.current().size(), 1u);
  EXPECT_EQ(d.current()[0].rank, 2);
}

TEST(Stragglers, NoiseAndAUniformLoadNameNoOne) {
  StragglerDetector d;
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 0.01);  // 20% per-step jitter around 50 ms
  // Everyone twice as slow from second 60 on (a load on the whole machine): nobody stands out.
  const auto changes = run(d, 6, 300, [&](int, int t) { return (t > 60 ? 0.1 : 0.05) + noise(rng); });
  EXPECT_TRUE(changes.empty()) << "named rank " << changes[0].rank << " " << changes[0].slowdown;
  EXPECT_TRUE(d.take_named().empty());
}

TEST(Stragglers, TwoRanksCompareWithEachOther) {
  StragglerDetector d;
  const auto changes = run(d, 2, 40, [](int r, int) { return r == 1 ? 0.012 : 0.010; });
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 1);
  EXPECT_NEAR(changes[0].slowdown, 1.2, 1e-6);
}

TEST(Stragglers, TinyStepsNeedARealExcessAndAResetEndsWhatIsOpen) {
  StragglerDetector d;
  // 0.1 ms against 0.2 ms: twice as long, but a tenth of a millisecond is timer noise.
  EXPECT_TRUE(run(d, 3, 30, [](int r, int) { return r == 0 ? 0.0002 : 0.0001; }).empty());
  StragglerDetector e;
  ASSERT_EQ(run(e, 3, 30, [](int r, int) { return r == 0 ? 0.02 : 0.01; }).size(), 1u);
  e.reset(/*step=*/777);  // a recovery: other members
  EXPECT_TRUE(e.current().empty());
  const auto named = e.take_named();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].to_step, 777);
  EXPECT_TRUE(e.take_named().empty());
}

TEST(Stragglers, OneStillSlowIsReportedAgainByTheNextTake) {
  StragglerDetector d;
  ASSERT_EQ(run(d, 3, 30, [](int r, int) { return r == 0 ? 0.02 : 0.01; }).size(), 1u);
  EXPECT_EQ(d.take_named().size(), 1u);
  const auto again = d.take_named();
  ASSERT_EQ(again.size(), 1u) << "still slow: the next call names it too";
  EXPECT_EQ(again[0].to_step, -1);
}

}  // namespace
}  // namespace dsgd::runtime
