// PowerSGD's across-host stage (strategy/powersgd.h) on leaders as threads over a memory store:
// exact on matrices of rank <= R, error feedback that loses nothing, vectors and small matrices
// sent as they are, the plain start, the same answer on every leader, fewer bytes.
#include "strategy/powersgd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dsgd/comm/group.h"
#include "dsgd/comm/store.h"
#include "dsgd/common/error.h"
#include "testing/ranks.h"

namespace dsgd::strategy {
namespace {

using std::chrono::milliseconds;

TEST(PowerSgd, OrthonormalizeColumnsLeavesOrthonormalColumns) {
  const size_t rows = 50, cols = 4;
  std::vector<float> a(rows * cols);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(static_cast<float>(i * i % 97));
  orthonormalize_columns(a.data(), rows, cols);
  for (size_t j = 0; j < cols; ++j) {
    for (size_t k = 0; k <= j; ++k) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * cols + j]) * a[i * cols + k];
      EXPECT_NEAR(dot, j == k ? 1.0 : 0.0, 1e-5) << j << " " << k;
    }
  }
}

TEST(PowerSgd, CompressesMatricesWhoseFactorsAreAtMostHalfTheirSize) {
  EXPECT_TRUE(PowerSgd::compresses(64, 64, 4));     // 2 x 4 x 128 = 1024 <= 4096
  EXPECT_FALSE(PowerSgd::compresses(8, 8, 4));      // 128 > 64
  EXPECT_FALSE(PowerSgd::compresses(1, 1000, 1));   // a vector
  EXPECT_TRUE(PowerSgd::compresses(16, 16, 4));     // 2 x 4 x 32 = 256 <= 256
}

// One bucket: a 40 x 30 matrix, a vector of 7, and an 3 x 3 matrix (too small to compress).
struct Layout {
  std::vector<MatrixSlot> matrices = {{0, 40, 30}, {1207, 3, 3}};
  size_t count = 1200 + 7 + 9;
};

// h leaders, each with `fill(host, element)` as its host's sum; returns every leader's result,
// residual and bytes after `calls` calls of reduce (the same input each call).
struct Outcome {
  std::vector<std::vector<float>> data, residual;
  std::vector<uint64_t> bytes;
};
Outcome run(int hosts, int rank, int start_steps, int calls, const std::function<float(int, size_t)>& fill) {
  Layout layout;
  Outcome out;
  out.data.resize(static_cast<size_t>(hosts));
  out.residual.resize(static_cast<size_t>(hosts));
  out.bytes.resize(static_cast<size_t>(hosts));
  auto store = comm::make_memory_store();
  testing::run_ranks(hosts, [&](int h) {
    comm::GroupOptions o;
    o.timeout = milliseconds(5000);
    auto group = comm::Group::create(store, h, hosts, o);
    PowerSgd psgd({.rank = rank, .start_steps = start_steps, .seed = 7});
    std::vector<float> residual(layout.count, 0.0f), data(layout.count);
    PowerSgdState state;
    uint64_t bytes = 0;
    for (int c = 0; c < calls; ++c) {
      for (size_t e = 0; e < layout.count; ++e) data[e] = fill(h, e);
      const PowerSgdBucket bucket{.index = 3, .state = &state, .residual = residual.data(),
                                  .matrices = &layout.matrices};
      bytes = psgd.reduce(*group, bucket, data.data(), layout.count, milliseconds(5000));
    }
    out.data[static_cast<size_t>(h)] = data;
    out.residual[static_cast<size_t>(h)] = residual;
    out.bytes[static_cast<size_t>(h)] = bytes;
  });
  return out;
}

// Host h's share of the big matrix has rank 1 (u_h v_h^T); over 2 hosts the sum has rank 2.
float low_rank(int h, size_t e) {
  if (e >= 1200) return static_cast<float>(e % 5) + static_cast<float>(h);  // the vector and the small matrix
  const size_t i = e / 30, k = e % 30;
  return std::sin(static_cast<float>(i + 1) * static_cast<float>(h + 1)) *
         std::cos(static_cast<float>(k) * 0.3f + static_cast<float>(h));
}

TEST(PowerSgd, AMatrixOfRankAtMostRComesBackExactAndEveryLeaderAgrees) {
  const auto r = run(2, 2, 0, 1, low_rank);
  for (size_t e = 0; e < 1216; ++e) {
    const float sum = low_rank(0, e) + low_rank(1, e);
    if (e < 1200) {
      ASSERT_NEAR(r.data[0][e], sum, 1e-4f) << "element " << e;
    } else {
      ASSERT_EQ(r.data[0][e], sum) << "element " << e << ": not compressed, sent as it is";
    }
    ASSERT_EQ(r.data[0][e], r.data[1][e]) << "element " << e;
  }
  // Fewer bytes: R (40 + 30) per matrix and the rest, against all 1216 values.
  const uint64_t plain = 2 * 1216 * 4 / 2;
  EXPECT_EQ(r.bytes[0], 2ULL * 1 * (2 * 40 + 16) * 4 / 2 + 2ULL * 1 * (2 * 30) * 4 / 2);
  EXPECT_LT(r.bytes[0] * 5, plain);
}

// Full rank at rank 1: lossy. The feedback keeps what was left out: each leader's input (its
// sum plus its old residual) is 1/h of the approximation plus its new residual.
TEST(PowerSgd, ErrorFeedbackKeepsWhatTheApproximationLeftOut) {
  auto full = [](int h, size_t e) { return std::sin(static_cast<float>(e * e % 101) + static_cast<float>(h)); };
  const auto once = run(2, 1, 0, 1, full);
  for (int h = 0; h < 2; ++h) {
    for (size_t e = 0; e < 1200; ++e) {
      ASSERT_NEAR(once.data[static_cast<size_t>(h)][e] / 2 + once.residual[static_cast<size_t>(h)][e], full(h, e),
                  1e-5f)
          << "host " << h << " element " << e;
    }
    for (size_t e = 1200; e < 1216; ++e) ASSERT_EQ(once.residual[static_cast<size_t>(h)][e], 0.0f);
  }
  double left = 0;
  for (size_t e = 0; e < 1200; ++e) left += std::fabs(once.residual[0][e]);
  EXPECT_GT(left, 1.0) << "rank 1 of a full-rank matrix should leave something out";
  // Fed back: the same gradient call after call, what was sent adds up to the calls times the
  // sum, less the hosts' residuals together, which stay bounded (a projection leaves out at most
  // what there was), so the mean of what was sent approaches the sum as 1/calls.
  Layout layout;
  auto store = comm::make_memory_store();
  std::vector<std::vector<double>> total_residual(2);  // after each call: max |sum over hosts|
  std::vector<std::vector<float>> residuals(2);
  const int calls = 240;
  std::vector<std::vector<double>> sent(2);
  testing::run_ranks(2, [&](int h) {
    comm::GroupOptions o;
    o.timeout = milliseconds(5000);
    auto group = comm::Group::create(store, h, 2, o);
    PowerSgd psgd({.rank = 1, .start_steps = 0, .seed = 7});
    std::vector<float> residual(layout.count, 0.0f), data(layout.count);
    PowerSgdState state;
    auto& mine = sent[static_cast<size_t>(h)];
    mine.assign(layout.count, 0.0);
    for (int c = 0; c < calls; ++c) {
      for (size_t e = 0; e < layout.count; ++e) data[e] = full(h, e);
      psgd.reduce(*group, {.index = 0, .state = &state, .residual = residual.data(), .matrices = &layout.matrices},
                  data.data(), layout.count, milliseconds(5000));
      for (size_t e = 0; e < layout.count; ++e) mine[e] += data[e];
    }
    residuals[static_cast<size_t>(h)] = residual;
  });
  double once_worst = 0;
  for (size_t e = 0; e < 1200; ++e) {
    once_worst = std::max<double>(once_worst, std::fabs(once.data[0][e] - (full(0, e) + full(1, e))));
  }
  double worst = 0, bound = 0;
  for (size_t e = 0; e < 1200; ++e) {
    const double sum = full(0, e) + full(1, e);
    const double r = static_cast<double>(residuals[0][e]) + residuals[1][e];
    // sent = calls x sum - residuals together (to float rounding)
    ASSERT_NEAR(sent[0][e], calls * sum - r, 1e-3 * calls) << e;
    worst = std::max(worst, std::fabs(sent[0][e] / calls - sum));
    bound = std::max(bound, std::fabs(r));
  }
  // Here (rank 1 of a full-rank 40 x 30 matrix): one send is 0.53 off at worst; the mean of 60
  // is 1.22 off (residuals together up to 73), of 240 0.25 (59), of 960 0.055 (53).
  EXPECT_LT(worst, once_worst / 2) << "residuals together up to " << bound;
  EXPECT_LT(bound, 100.0);
}

TEST(PowerSgd, TheFirstStartStepsArePlainAllreduces) {
  auto full = [](int h, size_t e) { return std::sin(static_cast<float>(e * e % 101) + static_cast<float>(h)); };
  const auto r = run(2, 1, 3, 3, full);
  for (size_t e = 0; e < 1216; ++e) {
    ASSERT_EQ(r.data[0][e], full(0, e) + full(1, e)) << e;
    ASSERT_EQ(r.residual[0][e], 0.0f) << e;
  }
  EXPECT_EQ(r.bytes[0], 1216u * 4);
}

TEST(PowerSgd, BadOptionsAreConfigErrors) {
  EXPECT_THROW(PowerSgd({.rank = 0}), ConfigError);
  EXPECT_THROW(PowerSgd({.rank = 4, .start_steps = -1}), ConfigError);
}

}  // namespace
}  // namespace dsgd::strategy
