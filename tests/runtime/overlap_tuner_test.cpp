// forward_overlap_buckets auto: the trial order, the chunk lengths, and the choice.
#include "runtime/overlap_tuner.h"

#include <gtest/gtest.h>

namespace dsgd::runtime {
namespace {

TEST(OverlapTuner, TriesEighthsOfTheBucketsThenKeepsTheFastest) {
  OverlapTuner t;
  EXPECT_TRUE(t.tuning());
  EXPECT_EQ(t.next(), 0u);                                      // T = 0 first, before N is known
  EXPECT_EQ(t.trial_chunk(0), OverlapTuner::kTrialSteps);       // "to the epoch's end": one trial
  EXPECT_EQ(t.trial_chunk(100), OverlapTuner::kTrialSteps);
  EXPECT_EQ(t.trial_chunk(4), 4);                               // never more than planned
  // 16 buckets: T = 0, 2, 4, ..., 12, one chunk each. T = 8 is fastest.
  const std::vector<size_t> tried = {0, 2, 4, 6, 8, 10, 12};
  const std::vector<double> step_s = {0.130, 0.128, 0.127, 0.125, 0.121, 0.124, 0.133};
  for (size_t i = 0; i < tried.size(); ++i) {
    ASSERT_TRUE(t.tuning()) << i;
    EXPECT_EQ(t.next(), tried[i]);
    t.record(6, step_s[i], 16);
  }
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.next(), 8u);
  EXPECT_EQ(t.trial_chunk(0), 0);  // decided: chunks as planned
  EXPECT_EQ(t.trial_chunk(50), 50);
  EXPECT_NE(t.summary().find("T=8: 121.0 ms"), std::string::npos) << t.summary();
  EXPECT_NE(t.summary().find("chose 8"), std::string::npos) << t.summary();
  t.record(6, 0.001, 16);  // later chunks change nothing
  EXPECT_EQ(t.next(), 8u);
}

TEST(OverlapTuner, KeepsZeroUnlessAnotherIsClearlyFaster) {
  OverlapTuner t;
  t.record(6, 0.100, 5);  // 5 buckets: 0, 1, 2, 3, 4
  for (size_t T : {1u, 2u, 3u, 4u}) {
    EXPECT_EQ(t.next(), T);
    t.record(6, T == 2 ? 0.098 : 0.110, 5);  // 2% faster: within the margin
  }
  EXPECT_FALSE(t.tuning());
  EXPECT_EQ(t.next(), 0u);
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
