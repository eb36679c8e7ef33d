// LossScaler: GradScaler's rules (back off on overflow, grow after N good steps), powers of two
// only, bounded, restorable.
#include "torch/replica/loss_scaler.h"

#include <gtest/gtest.h>

#include <vector>

namespace dsgd::torch_glue {
namespace {

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterGrowthIntervalGoodStepsInARow) {
  LossScaler s({.init_scale = 1024, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // skipped: the two good steps no longer count
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));  // the third in a row
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.good_steps(), 0);
}

TEST(LossScaler, StaysWithinItsBoundsAndSaysWhenItCannotBackOff) {
  LossScaler low({.init_scale = 0x1p-23, .growth_interval = 1});
  EXPECT_FALSE(low.at_minimum());
  low.update(false);
  EXPECT_TRUE(low.at_minimum());
  low.update(false);
  EXPECT_EQ(low.scale(), LossScaler::kMinScale);
  LossScaler high({.init_scale = 0x1p63, .growth_interval = 1});
  for (int i = 0; i < 5; ++i) high.update(true);
  EXPECT_EQ(high.scale(), LossScaler::kMaxScale);
}

TEST(LossScaler, OnlyPowersOfTwoSoScalingIsExact) {
  for (double bad : {0.0, -4.0, 1000.0, 3.0, 0x1p70, 0x1p-30}) {
    EXPECT_THROW(LossScaler({.init_scale = bad}), ConfigError) << bad;
  }
  EXPECT_THROW(LossScaler({.init_scale = 4, .growth_interval = 0}), ConfigError);
  // x * S / S == x for any float x whose scaled value stays normal: the unscaled step, bit for bit.
  const std::vector<float> xs = {1e-30f, 3.1415926f, -7.25e12f, 1.17549435e-38f * 1024};
  for (float x : xs) {
    const float scaled = x * 65536.0f;
    EXPECT_EQ(scaled * (1.0f / 65536.0f), x);
  }
}

TEST(LossScaler, RestoreTakesOnlyAValidState) {
  LossScaler s({.init_scale = 256, .growth_interval = 10});
  s.restore(4096, 7);
  EXPECT_EQ(s.scale(), 4096);
  EXPECT_EQ(s.good_steps(), 7);
  s.restore(1000, 1);  // not a power of two: ignored
  EXPECT_EQ(s.scale(), 4096);
  s.update(true);
  s.update(true);
  s.update(true);  // 10 in a row
  EXPECT_EQ(s.scale(), 8192);
}

}  // namespace
}  // namespace dsgd::torch_glue
