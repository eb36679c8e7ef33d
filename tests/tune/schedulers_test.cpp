// ASHA's rungs and cut-offs, and PBT's exploit choices, against hand-worked cases.
#include "tune/schedulers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace dsgd::tune {
namespace {

TEST(Asha, RungsAtGraceTimesFactorPowersBelowTheEnd) {
  EXPECT_EQ(Asha({.grace_period = 1, .reduction_factor = 3, .max_iterations = 9}).rungs(), (std::vector<int>{1, 3}));
  EXPECT_EQ(Asha({.grace_period = 1, .reduction_factor = 2, .max_iterations = 8}).rungs(), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(Asha({.grace_period = 2, .reduction_factor = 3, .max_iterations = 4}).rungs(), (std::vector<int>{2}));
}

TEST(Asha, ATrialGoesOnOnlyInTheBestThirdOfThoseRecordedBeforeIt) {
  Asha asha({.grace_period = 1, .reduction_factor = 3, .max_iterations = 9, .maximize = true});
  EXPECT_TRUE(asha.report(0, 1, 0.50));  // the first at a rung always goes on
  EXPECT_TRUE(asha.report(1, 1, 0.70));  // cut-off 0.50
  EXPECT_FALSE(asha.report(2, 1, 0.55)); // cut-off: 2/3 quantile of {0.5, 0.7} = 0.633
  EXPECT_TRUE(asha.report(3, 1, 0.66));  // of {0.5, 0.55, 0.7}: 0.6
  EXPECT_TRUE(asha.report(0, 2, 0.10));  // not a rung
  EXPECT_TRUE(asha.report(1, 1, 0.0));   // a rung is decided once per trial
  Asha min({.grace_period = 1, .reduction_factor = 2, .max_iterations = 4, .maximize = false});
  EXPECT_TRUE(min.report(0, 1, 2.0));
  EXPECT_FALSE(min.report(1, 1, 3.0));   // a loss: lower is better
  EXPECT_TRUE(min.report(2, 1, 1.0));
  EXPECT_FALSE(min.report(3, 1, NAN));   // a NaN never goes on
}

TEST(Asha, RecordedHistoryDecidesLaterTrialsAsBefore) {
  Asha asha({.grace_period = 1, .reduction_factor = 3, .max_iterations = 9});
  asha.record(0, 1, 0.5);
  asha.record(1, 1, 0.7);
  EXPECT_FALSE(asha.report(2, 1, 0.55));
}

TEST(Pbt, TheWorstQuantileTakesFromTheBestAndUnscoredTrialsAreLeftOut) {
  std::mt19937_64 gen(1);
  const std::vector<double> scores = {0.8, 0.6, NAN, 0.9, 0.7, 0.5, 0.85, 0.65};  // 7 scored
  for (int i = 0; i < 50; ++i) {
    const auto pairs = pbt_exploits(scores, true, 0.25, gen);
    ASSERT_EQ(pairs.size(), 2u);  // ceil(7 x 0.25)
    EXPECT_EQ(pairs[0].first, 5u);  // 0.5, the worst
    EXPECT_EQ(pairs[1].first, 1u);  // 0.6
    for (const auto& [loser, winner] : pairs) EXPECT_TRUE(winner == 3u || winner == 6u) << winner;  // 0.9, 0.85
  }
  EXPECT_TRUE(pbt_exploits({0.5}, true, 0.25, gen).empty());
  const auto pairs = pbt_exploits({1.0, 3.0}, false, 0.5, gen);  // minimising: 3.0 is the worse
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0], (std::pair<size_t, size_t>{1, 0}));
}

}  // namespace
}  // namespace dsgd::tune
