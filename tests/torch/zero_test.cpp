#include "torch/sync/zero.h"

#include <gtest/gtest.h>

#include <numeric>

namespace dsgd::torch_glue {
namespace {

// Largest first, each to the least-loaded rank: every rank within one tensor of even, the same
// answer for the same sizes, and every tensor owned once.
TEST(ZeroPartition, BalancesWholeTensorsBySizeLargestFirst) {
  const std::vector<int64_t> numels{10, 400, 30, 400, 5, 200, 200};
  const auto owner = partition_by_size(numels, 3);
  ASSERT_EQ(owner.size(), numels.size());
  std::vector<int64_t> load(3, 0);
  for (size_t i = 0; i < numels.size(); ++i) {
    ASSERT_GE(owner[i], 0);
    ASSERT_LT(owner[i], 3);
    load[static_cast<size_t>(owner[i])] += numels[i];
  }
  EXPECT_EQ(owner[1], 0);  // 400 to rank 0, the other 400 to rank 1, the 200s to 2 and 2 (400)
  EXPECT_EQ(owner[3], 1);
  EXPECT_EQ(owner[5], 2);
  EXPECT_EQ(owner[6], 2);
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, 400);
  EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t{0}), 1245);
  EXPECT_EQ(partition_by_size(numels, 3), owner);
  EXPECT_EQ(partition_by_size(numels, 1), std::vector<int>(numels.size(), 0));
}

}  // namespace
}  // namespace dsgd::torch_glue
