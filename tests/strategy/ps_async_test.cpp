// ps_async with ranks as threads on pseudo-hosts: pushes taken one at a time give sequential SGD
// on the owners' shards, with the staleness each push saw; a pull brings parameters and momentum;
// the staleness bound holds a replica that is too far ahead until the slowest catches up.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

#include "dsgd/common/error.h"
#include "strategy/strategy.h"
#include "testing/ranks.h"

namespace dsgd::strategy {
namespace {

using std::chrono::milliseconds;

std::shared_ptr<comm::HierarchicalGroup> async_group(std::shared_ptr<comm::Store> store, int rank, int size,
                                                     int hosts) {
  comm::GroupOptions o;
  o.timeout = milliseconds(10000);
  o.host = "host" + std::to_string(rank * hosts / size);
  return comm::HierarchicalGroup::create(std::move(store), rank, size, o);
}

constexpr size_t kCount = 101;
const SgdOptions kSgd{.lr = 0.5f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = false};

float grad(int rank, size_t i) { return static_cast<float>(rank + 1) * 0.01f + static_cast<float>(i) * 1e-4f; }

// 3 ranks on 3 hosts, 3 shards (one per rank): rank 0 pushes, then rank 1, then rank 2 pulls.
TEST(PsAsyncStrategy, PushesOneAtATimeAreSequentialSgdAndAPullBringsParametersAndMomentum) {
  constexpr int kSize = 3;
  // Reference: SGD with momentum, rank 0's gradient then rank 1's, each applied whole.
  std::vector<double> p(kCount), m(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    p[i] = 1.0 - static_cast<double>(i) * 1e-3;
    m[i] = grad(0, i);                       // first step: momentum = gradient
    p[i] -= kSgd.lr * m[i];
    m[i] = m[i] * kSgd.momentum + grad(1, i);
    p[i] -= kSgd.lr * m[i];
  }
  auto store = comm::make_memory_store();
  std::barrier sync(kSize);
  std::vector<std::vector<float>> got(kSize), momentum(kSize);
  std::vector<ServerUpdates::Staleness> staleness(kSize);
  testing::run_ranks(kSize, [&](int rank) {
    auto s = make_ps_async_strategy(async_group(store, rank, kSize, kSize), kSize, /*max_staleness=*/-1);
    EXPECT_TRUE(s->server_updates() != nullptr);
    std::vector<float> start(kCount);
    for (size_t i = 0; i < kCount; ++i) start[i] = 1.0f - static_cast<float>(i) * 1e-3f;
    s->server_updates()->start_servers(9, start.data(), nullptr, kCount);
    sync.arrive_and_wait();  // every owner started before any push
    std::vector<float> data(kCount);
    for (int turn = 0; turn < 2; ++turn) {
      if (rank == turn) {
        for (size_t i = 0; i < kCount; ++i) data[i] = grad(rank, i);
        bool applied = false;
        s->server_updates()
            ->update_async({.key = 9, .data = data.data(), .count = kCount, .sgd = kSgd}, &applied)
            ->wait();
        EXPECT_TRUE(applied);
        got[static_cast<size_t>(rank)] = data;
      }
      sync.arrive_and_wait();
    }
    if (rank == 2) {
      std::vector<float> m(kCount, -1.0f);
      bool has = false;
      s->server_updates()->gather_state_async(9, data.data(), m.data(), kCount, &has)->wait();
      EXPECT_TRUE(has);
      got[2] = data;
      momentum[2] = m;
    }
    staleness[static_cast<size_t>(rank)] = s->server_updates()->take_staleness();
    sync.arrive_and_wait();  // no strategy goes while another still talks to it
  });
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_NEAR(got[1][i], p[i], 1e-5) << i;      // rank 1's push returned the parameters after both
    ASSERT_NEAR(got[2][i], p[i], 1e-5) << i;      // the pull, the same
    ASSERT_NEAR(momentum[2][i], m[i], 1e-5) << i;
  }
  // Rank 0 pushed onto the start (staleness 0); rank 1 onto parameters one update newer than
  // the ones it computed on (it had seen none): staleness 1 on each of the 3 shards.
  EXPECT_EQ(staleness[0].updates, 3);
  EXPECT_EQ(staleness[0].max, 0);
  EXPECT_EQ(staleness[1].updates, 3);
  EXPECT_EQ(staleness[1].sum, 3);
  EXPECT_EQ(staleness[1].max, 1);
}

// 2 ranks, max_staleness 1: rank 0 may be one update ahead of rank 1, not two.
TEST(PsAsyncStrategy, AReplicaTooFarAheadWaitsForTheSlowest) {
  auto store = comm::make_memory_store();
  std::barrier sync(2);
  testing::run_ranks(2, [&](int rank) {
    auto s = make_ps_async_strategy(async_group(store, rank, 2, 2), 2, /*max_staleness=*/1);
    std::vector<float> start(kCount, 1.0f), data(kCount);
    s->server_updates()->start_servers(1, start.data(), nullptr, kCount);
    sync.arrive_and_wait();
    bool applied = false;
    auto push = [&] {
      std::fill(data.begin(), data.end(), 0.01f);
      return s->server_updates()->update_async({.key = 1, .data = data.data(), .count = kCount, .sgd = kSgd}, &applied);
    };
    if (rank == 0) {
      push()->wait();
      push()->wait();  // one ahead: allowed
      auto third = push();
      std::this_thread::sleep_for(milliseconds(300));
      EXPECT_FALSE(third->test()) << "two updates ahead of the slowest, and not held back";
      sync.arrive_and_wait();  // rank 1 pushes now
      third->wait(milliseconds(5000));
    } else {
      sync.arrive_and_wait();
      push()->wait();
    }
    sync.arrive_and_wait();
  });
}

TEST(PsAsyncStrategy, BadShardCountIsAConfigError) {
  auto store = comm::make_memory_store();
  testing::run_ranks(1, [&](int rank) {
    auto g = async_group(store, rank, 1, 1);
    EXPECT_THROW(make_ps_async_strategy(g, 0, 4), ConfigError);
  });
}

}  // namespace
}  // namespace dsgd::strategy
