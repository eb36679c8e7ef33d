// The distributed sampler's arithmetic: every sample of a batch to exactly one replica, parts as
// even as possible, weights that make the average the whole batch's mean.
#include "torch/replica/sampler.h"

#include <gtest/gtest.h>

namespace dsgd::torch_glue {
namespace {

TEST(EpochSampler, PartsCoverEachBatchOnceAndDifferByAtMostOne) {
  for (int64_t world : {1, 2, 3, 7}) {
    for (int64_t n : {int64_t{10}, int64_t{64}, int64_t{1000}}) {
      const int64_t batch = 16;
      for (int64_t b = 0; b < EpochSampler{n, batch, world, 0}.batches_per_epoch(); ++b) {
        int64_t next = b * batch, smallest = batch, largest = 0;
        double weights = 0;
        for (int64_t r = 0; r < world; ++r) {
          const EpochSampler s{n, batch, world, r};
          const auto [begin, end] = s.part(b);
          EXPECT_EQ(begin, next) << "world " << world << " n " << n << " batch " << b << " rank " << r;
          next = end;
          smallest = std::min(smallest, end - begin);
          largest = std::max(largest, end - begin);
          weights += s.weight(b) / static_cast<double>(world);
        }
        EXPECT_EQ(next, b * batch + (EpochSampler{n, batch, world, 0}.batch_size(b)));
        EXPECT_LE(largest - smallest, 1);
        EXPECT_NEAR(weights, 1.0, 1e-12);
      }
    }
  }
}

TEST(EpochSampler, ALastBatchSmallerThanTheWorldIsDropped) {
  EXPECT_EQ((EpochSampler{100, 32, 4, 0}.batches_per_epoch()), 4);  // 3 full, and 4 samples for 4 replicas
  EXPECT_EQ((EpochSampler{99, 32, 4, 0}.batches_per_epoch()), 3);   // 3 samples left: fewer than 4 replicas
  EXPECT_EQ((EpochSampler{96, 32, 4, 0}.batches_per_epoch()), 3);
  const auto [begin, end] = EpochSampler{100, 32, 4, 3}.part(3);
  EXPECT_EQ(begin, 99);
  EXPECT_EQ(end, 100);
}

}  // namespace
}  // namespace dsgd::torch_glue
