// Progress output: a redrawn bar on a terminal, plain throttled lines elsewhere.
#include "progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace dsgd::cli {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

dsgd::BatchProgress batch(int64_t step, int64_t total) {
  return {.epoch = 1, .epochs = 2, .batch = step, .batches_per_epoch = total / 2, .step = step, .total_steps = total,
          .loss = 0.5, .samples_per_s = 100, .elapsed_s = static_cast<double>(step)};
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(247), "4:07");
  EXPECT_EQ(format_duration(3909), "1:05:09");
  EXPECT_EQ(format_duration(-1), "?");
}

TEST(Progress, PlainModeThrottlesLinesButAlwaysPrintsTheLastStep) {
  std::FILE* f = std::tmpfile();
  ProgressPrinter p(f, /*interactive=*/false, /*line_interval_s=*/3600);
  for (int64_t s = 1; s <= 10; ++s) p.on_batch(batch(s, 10));
  p.on_epoch({.epoch = 1, .train_loss = 0.4, .test_loss = 0.3, .test_accuracy = 0.9, .samples_per_s = 100, .epoch_s = 5,
              .profile_ms = {}});
  const std::string out = contents(f);
  std::fclose(f);
  // The first step (interval elapsed since start) and the last one; nothing redrawn in place.
  EXPECT_NE(out.find("epoch 1/2 batch 1/5  loss 0.5000  100 samples/s  ETA 0:09\n"), std::string::npos) << out;
  EXPECT_NE(out.find("batch 10/5"), std::string::npos) << out;
  EXPECT_EQ(out.find("batch 5/5"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1 done in 5.0 s: train loss 0.4000, 100 samples/s, test loss 0.3000, test accuracy 90.00%"),
            std::string::npos)
      << out;
}

TEST(Progress, ALanguageModelCountsTokensAndShowsPerplexity) {
  std::FILE* f = std::tmpfile();
  ProgressPrinter p(f, /*interactive=*/false);
  p.count_tokens(256);
  p.on_batch(batch(1, 10));
  p.on_epoch({.epoch = 1, .train_loss = 2.1, .test_loss = 2.0, .samples_per_s = 100, .epoch_s = 5, .profile_ms = {}});
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_NE(out.find("loss 0.5000  25600 tokens/s  ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1 done in 5.0 s: train loss 2.1000, 25600 tokens/s, val loss 2.0000, perplexity 7.39"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("accuracy"), std::string::npos) << out;
}

TEST(Progress, InteractiveModeRedrawsABar) {
  std::FILE* f = std::tmpfile();
  ProgressPrinter p(f, /*interactive=*/true);
  p.on_batch(batch(3, 12));
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_EQ(out.rfind("\r\033[K", 0), 0u) << out;
  EXPECT_NE(out.find("[############............] 3/6"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA 0:09"), std::string::npos) << out;
}

TEST(Progress, AnEpochWithAProfileSaysWhereItsStepsWent) {
  std::FILE* f = std::tmpfile();
  ProgressPrinter p(f, /*interactive=*/false);
  p.on_epoch({.epoch = 2, .train_loss = 0.4, .samples_per_s = 100, .epoch_s = 5,
              .profile_ms = {{"forward", 17.26}, {"backward", 35}, {"optimizer", 0.42}, {"comm_wait", 5.08},
                             {"snapshot", 0.21}, {"other", 0.8}, {"step", 58.77}}});
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_NE(out.find("epoch 2 done in 5.0 s: train loss 0.4000, 100 samples/s\n  per step, mean over workers: "
                     "forward 17.3 ms, backward 35.0 ms, optimizer 0.4 ms, waiting for communication 5.1 ms, "
                     "the driver's snapshots 0.2 ms, other 0.8 ms (of a 58.8 ms step)\n"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace dsgd::cli
