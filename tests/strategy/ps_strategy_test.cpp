// The ps strategy with ranks as threads split into pseudo-hosts: the average it computes, with
// 1, 2 and 4 shards on 1, 2 and 4 hosts, against closed forms; every replica bit-identical;
// many buckets in flight at once (pipelined) stay in order; abort fails what is queued.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "dsgd/error.h"
#include "strategy/strategy.h"
#include "testing/ranks.h"

namespace dsgd::strategy {
namespace {

using std::chrono::milliseconds;

std::shared_ptr<comm::HierarchicalGroup> make_group(std::shared_ptr<comm::Store> store, int rank, int size, int hosts,
                                                   const std::vector<int>& host_of = {}) {
  comm::GroupOptions o;
  o.timeout = milliseconds(10000);
  o.host = "host" + std::to_string(host_of.empty() ? rank * hosts / size : host_of[static_cast<size_t>(rank)]);
  comm::ShmOptions so;
  so.slot_bytes = 1 << 20;
  return comm::HierarchicalGroup::create(std::move(store), rank, size, o, so);
}

void check(int size, int hosts, int shards, const std::vector<int>& host_of = {},
           std::vector<size_t> counts = {1, 3, 7, 1000, 100003, 5}) {  // fewer elements than shards, too
  auto store = comm::make_memory_store();
  std::vector<std::vector<std::vector<float>>> results(static_cast<size_t>(size));
  testing::run_ranks(size, [&](int rank) {
    auto strategy = make_ps_strategy(make_group(store, rank, size, hosts, host_of), shards);
    EXPECT_EQ(strategy->name(), "ps");
    // Every bucket launched before any is waited for, as backward does.
    std::vector<std::vector<float>> buckets;
    for (size_t count : counts) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * (i % 7 + 1)) + 0.25f * static_cast<float>(count % 3);
      buckets.push_back(std::move(v));
    }
    std::vector<std::shared_ptr<comm::Work>> works;
    for (auto& b : buckets) works.push_back(strategy->average_async(b.data(), b.size()));
    for (auto& w : works) w->wait();
    results[static_cast<size_t>(rank)] = buckets;
  });
  for (size_t k = 0; k < counts.size(); ++k) {
    for (size_t i = 0; i < counts[k]; ++i) {
      const double expected = static_cast<double>(i % 7 + 1) * (size + 1) / 2.0 + 0.25 * static_cast<double>(counts[k] % 3);
      ASSERT_NEAR(results[0][k][i], expected, 1e-5 * expected)
          << "size " << size << " hosts " << hosts << " shards " << shards << " bucket " << k << " element " << i;
    }
    for (int r = 1; r < size; ++r) {  // bit-identical replicas
      ASSERT_EQ(0, std::memcmp(results[0][k].data(), results[static_cast<size_t>(r)][k].data(), counts[k] * sizeof(float)))
          << "rank " << r << " bucket " << k;
    }
  }
}

TEST(PsStrategy, OneHost) { check(3, 1, 2); }
TEST(PsStrategy, TwoHostsOneShard) { check(4, 2, 1); }
TEST(PsStrategy, TwoHostsTwoShards) { check(4, 2, 2); }
TEST(PsStrategy, TwoHostsFourShards) { check(4, 2, 4); }
TEST(PsStrategy, FourHostsFourShards) { check(4, 4, 4); }
TEST(PsStrategy, UnevenHostsThreeShards) { check(3, 2, 3); }

// Ranks 0 and 2 on one host, 1 on another (what a replacement joining host 0 gives), with
// buckets of the MLP's size.
TEST(PsStrategy, InterleavedHostsAndLargeBuckets) {
  check(3, 2, 3, {0, 1, 0}, {2621440, 2621440, 590000});
}

TEST(PsStrategy, BadShardCountIsAConfigError) {
  auto store = comm::make_memory_store();
  testing::run_ranks(1, [&](int rank) {
    auto g = make_group(store, rank, 1, 1);
    EXPECT_THROW(make_ps_strategy(g, 0), ConfigError);
    EXPECT_THROW(make_ps_strategy(g, 65), ConfigError);
  });
}

TEST(PsStrategy, AbortFailsQueuedAveragesWithTheReason) {
  auto store = comm::make_memory_store();
  testing::run_ranks(2, [&](int rank) {
    auto s = make_ps_strategy(make_group(store, rank, 2, 2), 2);
    std::vector<float> v(1000, 1.0f);
    s->average_async(v.data(), v.size())->wait();
    s->abort("test abort");
    try {
      s->average_async(v.data(), v.size())->wait();
      FAIL() << "an aborted strategy averaged";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dsgd::strategy
