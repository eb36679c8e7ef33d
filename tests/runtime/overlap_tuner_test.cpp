// forward_overlap_buckets auto: the trial order, the chunk lengths, and the choice.
#include "runtime/driver/overlap_tuner.h"

#include <gtest/gtest.h>

namespace dsgd::runtime {
namespace {

// Trains the trials `tried` (checking each is next) with the given step times, N buckets.
void run_trials(OverlapTuner& t, const std::vector<size_t>& tried, const std::vector<double>& step_s, size_t n) {
  for (size_t i = 0; i < tried.size(); ++i) {
    ASSERT_TRUE(t.tuning()) << i;
    EXPECT_EQ(t.next(), tried[i]) << i;
    t.record(6, step_s[i], n);
  }
}

TEST(OverlapTuner, TriesSixteenthsOfTheBucketsThenTheFastestAgainAndKeepsTheBestMean) {
  OverlapTuner t;
  EXPECT_TRUE(t.tuning());
  EXPECT_EQ(t.next(), 0u);                                      // T = 0 first, before N is known
  EXPECT_EQ(t.trial_chunk(0), OverlapTuner::kTrialSteps);       // "to the epoch's end": one trial
  EXPECT_EQ(t.trial_chunk(100), OverlapTuner::kTrialSteps);
  EXPECT_EQ(t.trial_chunk(4), 4);                               // never more than planned
  // 16 buckets: T = 0, 3, 4, 5, 6, 8, one chunk each; T = 6 and 4 are fastest, 6 by a hair.
  run_trials(t, {0, 3, 4, 5, 6, 8}, {0.130, 0.128, 0.121, 0.125, 0.120, 0.133}, 16);
  // Then T = 0 and the two fastest again: 4's mean (0.1195) beats 6's (0.1215).
  EXPECT_EQ(t.trial_chunk(100), OverlapTuner::kTrialSteps);
  run_trials(t, {0, 4, 6}, {0.128, 0.118, 0.123}, 16);
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.next(), 4u);
  EXPECT_EQ(t.trial_chunk(0), 0);  // decided: chunks as planned
  EXPECT_EQ(t.trial_chunk(50), 50);
  EXPECT_NE(t.summary().find("T=4: 121.0 ms"), std::string::npos) << t.summary();
  EXPECT_NE(t.summary().find("again: T=0: 128.0 ms, T=4: 118.0 ms"), std::string::npos) << t.summary();
  EXPECT_NE(t.summary().find("chose 4"), std::string::npos) << t.summary();
  t.record(6, 0.001, 16);  // later chunks change nothing
  EXPECT_EQ(t.next(), 4u);
}

TEST(OverlapTuner, KeepsZeroUnlessAnotherIsClearlyFasterOnBothReadings) {
  OverlapTuner t;
  // 5 buckets: T = 0, 1, 2, 3. T = 2 is 5% faster in its first trial, no faster in its second:
  // the mean is within the margin.
  run_trials(t, {0, 1, 2, 3}, {0.100, 0.110, 0.095, 0.110}, 5);
  run_trials(t, {0, 1, 2}, {0.100, 0.110, 0.100}, 5);
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.next(), 0u);
  // T = 0's own second reading counts too: slower there, T = 2 clears the margin.
  OverlapTuner u;
  run_trials(u, {0, 1, 2, 3}, {0.100, 0.110, 0.095, 0.110}, 5);
  run_trials(u, {0, 1, 2}, {0.106, 0.110, 0.099}, 5);
  EXPECT_EQ(u.next(), 2u);
}

TEST(OverlapTuner, AShortChunkIsTriedAgain) {
  OverlapTuner t;
  t.record(2, 0.050, 1);  // an epoch's last 2 batches: not timed; 1 bucket: T = 0, 1
  EXPECT_TRUE(t.tuning());
  EXPECT_EQ(t.next(), 0u);
  t.record(6, 0.050, 1);
  EXPECT_EQ(t.next(), 1u);
  t.record(6, 0.0, 1);  // no steady time (fewer than 2 steps on some worker): again
  EXPECT_EQ(t.next(), 1u);
  t.record(6, 0.040, 1);
  run_trials(t, {0, 1}, {0.050, 0.040}, 1);  // the second round: T = 0 and the one finalist
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.next(), 1u);
}

TEST(OverlapTuner, NoBucketsMeansNothingToTry) {
  OverlapTuner t;
  t.record(6, 0.050, 0);
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.next(), 0u);
}

}  // namespace
}  // namespace dsgd::runtime
