// Gradient buckets: packing in reverse registration order under the size cap, and readiness.
#include "strategy/bucket_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "dsgd/common/error.h"

namespace dsgd::strategy {
namespace {

TEST(BucketPlan, PacksInReverseRegistrationOrderUnderTheCap) {
  // The CNN's parameters (float32) with a 1 MB cap: fc1.weight (4.7 MB) must sit alone.
  const std::vector<size_t> counts = {288, 32, 18432, 64, 1179648, 128, 1280, 10};
  BucketPlan plan(counts, 4, 1000000);
  ASSERT_EQ(plan.buckets().size(), 3u);
  EXPECT_EQ(plan.buckets()[0].params, (std::vector<size_t>{7, 6, 5}));  // fc2.bias, fc2.weight, fc1.bias
  EXPECT_EQ(plan.buckets()[1].params, (std::vector<size_t>{4}));        // fc1.weight: over the cap, alone
  EXPECT_EQ(plan.buckets()[2].params, (std::vector<size_t>{3, 2, 1, 0}));
  EXPECT_EQ(plan.total_elements(), std::accumulate(counts.begin(), counts.end(), size_t{0}));
  // Contiguous: each bucket starts where the previous ends, each slot inside its bucket.
  size_t offset = 0;
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bucket = plan.buckets()[b];
    EXPECT_EQ(bucket.offset, offset);
    size_t inside = bucket.offset;
    for (size_t p : bucket.params) {
      EXPECT_EQ(plan.slot(p).bucket, b);
      EXPECT_EQ(plan.slot(p).offset, inside);
      EXPECT_EQ(plan.slot(p).count, counts[p]);
      inside += counts[p];
    }
    EXPECT_EQ(inside, bucket.offset + bucket.count);
    if (bucket.params.size() > 1) {
      EXPECT_LE(bucket.count * 4, 1000000u);
    }
    offset += bucket.count;
  }
}

TEST(BucketPlan, OneBucketWhenEverythingFitsAndNoneWhenNoParameters) {
  EXPECT_EQ(BucketPlan({3, 4, 5}, 4, 10 << 20).buckets().size(), 1u);
  EXPECT_TRUE(BucketPlan({}, 4, 1024).buckets().empty());
  EXPECT_THROW(BucketPlan({1}, 4, 0), ConfigError);
  EXPECT_THROW(BucketPlan({1}, 0, 64), ConfigError);
}

// The forward overlap's schedule: T deferred buckets spread over 1..n-1, launched after the
// others, first layer (highest index) first.
TEST(OverlapSchedule, SpreadsTheDeferredBucketsAndLaunchesThemLastFirstLayerFirst) {
  const auto deferred_of = [](const OverlapSchedule& s) {
    std::vector<size_t> d;
    for (size_t b = 0; b < s.deferred.size(); ++b) {
      if (s.deferred[b]) d.push_back(b);
    }
    return d;
  };
  auto s = overlap_schedule(16, 4);
  EXPECT_EQ(deferred_of(s), (std::vector<size_t>{1, 4, 8, 12}));
  EXPECT_EQ(s.launch_order, (std::vector<size_t>{0, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 12, 8, 4, 1}));
  EXPECT_EQ(deferred_of(overlap_schedule(16, 5)), (std::vector<size_t>{1, 4, 7, 10, 13}));
  EXPECT_EQ(deferred_of(overlap_schedule(16, 15)).size(), 15u);  // all but bucket 0
  EXPECT_EQ(overlap_schedule(3, 1).launch_order, (std::vector<size_t>{0, 2, 1}));
  EXPECT_EQ(overlap_schedule(3, 3).launch_order, (std::vector<size_t>{2, 1, 0}));
  EXPECT_EQ(overlap_schedule(3, 9).launch_order, (std::vector<size_t>{2, 1, 0}));  // more than n: all
  EXPECT_EQ(overlap_schedule(3, 0).launch_order, (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(overlap_schedule(0, 2).launch_order.empty());
  // Every bucket launched once, for any n and T.
  for (size_t n = 1; n <= 40; ++n) {
    for (size_t t = 0; t <= n + 1; ++t) {
      const auto o = overlap_schedule(n, t);
      EXPECT_EQ(deferred_of(o).size(), std::min(t, n)) << n << " " << t;
      auto sorted = o.launch_order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<size_t> all(n);
      std::iota(all.begin(), all.end(), size_t{0});
      EXPECT_EQ(sorted, all) << n << " " << t;
    }
  }
}

TEST(ReadyTracker, CompletesEachBucketOnceInAnyOrder) {
  const std::vector<size_t> counts = {10, 10, 10, 10, 10, 10, 10};
  BucketPlan plan(counts, 4, 80);  // 2 parameters per bucket: {6,5} {4,3} {2,1} {0}
  ASSERT_EQ(plan.buckets().size(), 4u);
  ReadyTracker ready(plan);
  std::vector<size_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(3);
  for (int step = 0; step < 20; ++step) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int> completed(plan.buckets().size(), 0);
    for (size_t p : order) {
      if (auto b = ready.mark_ready(p)) {
        ++completed[*b];
        for (size_t q : plan.buckets()[*b].params)
          EXPECT_TRUE(std::find(order.begin(), order.end(), q) <= std::find(order.begin(), order.end(), p));
      }
    }
    EXPECT_EQ(completed, (std::vector<int>{1, 1, 1, 1}));
    EXPECT_TRUE(ready.pending_buckets().empty());
    ready.reset();
    EXPECT_EQ(ready.pending_buckets(), (std::vector<size_t>{0, 1, 2, 3}));
  }
}

TEST(ReadyTracker, AGradientTwiceOrOutOfRangeIsAnError) {
  BucketPlan plan({5, 5}, 4, 1024);
  ReadyTracker ready(plan);
  EXPECT_FALSE(ready.mark_ready(1).has_value());
  try {
    ready.mark_ready(1);
    FAIL() << "a second gradient for one parameter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("produced twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ready.mark_ready(2), Error);
  EXPECT_EQ(ready.pending_buckets(), (std::vector<size_t>{0}));
}

TEST(ReadyTracker, ConcurrentHooksCompleteEveryBucketExactlyOnce) {
  std::vector<size_t> counts(400, 3);
  BucketPlan plan(counts, 4, 48);  // 4 parameters per bucket
  ReadyTracker ready(plan);
  std::vector<std::atomic<int>> completed(plan.buckets().size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t p = static_cast<size_t>(t); p < counts.size(); p += 4) {
        if (auto b = ready.mark_ready(p)) completed[*b]++;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& c : completed) EXPECT_EQ(c.load(), 1);
}


// ZeRO's flat shards: over 1 to 4 replicas, every element of every parameter is exactly one
// replica's, at the place in its shard its bucket's block gives; every replica's block of a
// bucket is the same size (padded), so the shards hold as many elements each and the real ones
// differ by under N a bucket. One large tensor is cut like the rest (no whole-tensor owners).
TEST(ShardLayout, EveryElementIsOneReplicasAndTheBlocksAreEqual) {
  const std::vector<size_t> counts{10, 400, 30, 401, 5, 200, 199, 1};
  const BucketPlan plan(counts, 4, 1024);  // 256 floats a bucket: the 400s alone, others packed
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE(std::to_string(n) + " replicas");
    std::vector<std::vector<int>> owner(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) owner[i].assign(counts[i], 0);
    std::vector<size_t> real(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      const ShardLayout layout(plan, n, r);
      EXPECT_EQ(layout.sharded(), n > 1);
      size_t shard = 0;
      for (size_t b = 0; b < plan.buckets().size(); ++b) {
        EXPECT_EQ(layout.padded(b) % static_cast<size_t>(n), 0u);
        EXPECT_GE(layout.padded(b), plan.buckets()[b].count);
        EXPECT_LT(layout.padded(b), plan.buckets()[b].count + static_cast<size_t>(n));
        EXPECT_EQ(layout.shard_offset(b), shard);
        shard += layout.block(b);
      }
      EXPECT_EQ(layout.shard_elements(), shard);
      for (size_t i = 0; i < counts.size(); ++i) {
        const auto& p = layout.piece(i);
        const auto& s = plan.slot(i);
        if (p.count == 0) continue;
        ASSERT_LE(p.begin + p.count, counts[i]);
        // Its place in the bucket is its place in this replica's block.
        const size_t in_bucket = s.offset - plan.buckets()[s.bucket].offset + p.begin;
        EXPECT_EQ(in_bucket / layout.block(s.bucket), static_cast<size_t>(r));
        EXPECT_EQ(p.shard, layout.shard_offset(s.bucket) + in_bucket % layout.block(s.bucket));
        for (size_t e = p.begin; e < p.begin + p.count; ++e) ++owner[i][e];
        real[static_cast<size_t>(r)] += p.count;
      }
    }
    for (size_t i = 0; i < counts.size(); ++i) {
      EXPECT_TRUE(std::all_of(owner[i].begin(), owner[i].end(), [](int k) { return k == 1; })) << "parameter " << i;
    }
    const auto [lo, hi] = std::minmax_element(real.begin(), real.end());
    EXPECT_LE(*hi - *lo, plan.buckets().size() * static_cast<size_t>(n - 1)) << "balanced to under N a bucket";
  }
  EXPECT_THROW(ShardLayout(plan, 2, 2), Error);
}

}  // namespace
}  // namespace dsgd::strategy
