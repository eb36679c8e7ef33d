// The ps strategy with ranks as threads split into pseudo-hosts: the average it computes, with
// 1, 2 and 4 shards on 1, 2 and 4 hosts, against closed forms; every replica bit-identical;
// many buckets in flight at once (pipelined) stay in order; abort fails what is queued; with
// update on shards, SGD (decay, momentum, dampening, Nesterov) against its closed form. Each also
// with the shards in processes of their own (PsServer, here on threads of their own), which must
// give bit-identical results to the shards inside the leaders. And with a 16-bit wire.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "dsgd/common/error.h"
#include "strategy/ps_server.h"
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

// The ps strategy of `rank`; with o.shard_processes, host leaders also join the servers' group.
std::unique_ptr<GradientStrategy> make_ps(std::shared_ptr<comm::Store> store, int rank, int size, int hosts,
                                          PsOptions o, const std::vector<int>& host_of = {}) {
  auto group = make_group(store, rank, size, hosts, host_of);
  if (o.shard_processes && group->local().rank() == 0) {
    comm::GroupOptions go;
    go.timeout = milliseconds(10000);
    const int me = group->leaders() != nullptr ? group->leaders()->rank() : 0;
    o.servers = comm::Group::create(std::make_shared<comm::PrefixStore>(store, "ps/"), me, hosts + o.num_shards, go);
  }
  return make_ps_strategy(group, o);
}

// Shard `s` as its own process runs it (runtime/worker/ps_server_process.cpp), until the leaders hang
// up. The leaders check what it computed.
void serve_shard(std::shared_ptr<comm::Store> store, int hosts, int shards, int s) {
  comm::GroupOptions go;
  go.timeout = milliseconds(10000);
  std::shared_ptr<comm::Group> g =
      comm::Group::create(std::make_shared<comm::PrefixStore>(store, "ps/"), hosts + s, hosts + shards, go);
  PsServer server(g, hosts);
  try {
    server.serve();
  } catch (const CommError&) {  // the leaders closed their groups
  }
}

// Runs `replica(rank)` for `size` replicas and, with shard processes, `shards` servers besides.
void run_job(int size, int hosts, int shards, bool processes, std::shared_ptr<comm::Store> store,
             const std::function<void(int)>& replica) {
  testing::run_ranks(size + (processes ? shards : 0), [&](int rank) {
    if (rank >= size) {
      serve_shard(store, hosts, shards, rank - size);
    } else {
      replica(rank);
    }
  });
}

using Buckets = std::vector<std::vector<float>>;

// *out (if given) receives rank 0's results.
void check(int size, int hosts, int shards, bool processes = false, const std::vector<int>& host_of = {},
           std::vector<size_t> counts = {1, 3, 7, 1000, 100003, 5},  // fewer elements than shards, too
           Buckets* out = nullptr) {
  auto store = comm::make_memory_store();
  std::vector<std::vector<std::vector<float>>> results(static_cast<size_t>(size));
  run_job(size, hosts, shards, processes, store, [&](int rank) {
    auto strategy = make_ps(store, rank, size, hosts, {.num_shards = shards, .shard_processes = processes}, host_of);
    EXPECT_EQ(strategy->name(), "ps");
    // Every bucket launched before any is waited for, as backward does.
    std::vector<std::vector<float>> buckets;
    for (size_t count : counts) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i)
        v[i] = static_cast<float>((rank + 1) * (i % 7 + 1)) + 0.25f * static_cast<float>(count % 3);
      buckets.push_back(std::move(v));
    }
    std::vector<std::shared_ptr<comm::Work>> works;
    for (auto& b : buckets) works.push_back(strategy->average_async(b.data(), b.size()));
    for (auto& w : works) w->wait();
    results[static_cast<size_t>(rank)] = buckets;
  });
  for (size_t k = 0; k < counts.size(); ++k) {
    for (size_t i = 0; i < counts[k]; ++i) {
      const double expected =
          static_cast<double>(i % 7 + 1) * (size + 1) / 2.0 + 0.25 * static_cast<double>(counts[k] % 3);
      ASSERT_NEAR(results[0][k][i], expected, 1e-5 * expected)
          << "size " << size << " hosts " << hosts << " shards " << shards << " bucket " << k << " element " << i;
    }
    for (int r = 1; r < size; ++r) {  // bit-identical replicas
      ASSERT_EQ(0,
                std::memcmp(results[0][k].data(), results[static_cast<size_t>(r)][k].data(), counts[k] * sizeof(float)))
          << "rank " << r << " bucket " << k;
    }
  }
  if (out != nullptr) *out = results[0];
}

TEST(PsStrategy, OneHost) { check(3, 1, 2); }
TEST(PsStrategy, TwoHostsOneShard) { check(4, 2, 1); }
TEST(PsStrategy, TwoHostsTwoShards) { check(4, 2, 2); }
TEST(PsStrategy, TwoHostsFourShards) { check(4, 2, 4); }
TEST(PsStrategy, FourHostsFourShards) { check(4, 4, 4); }
TEST(PsStrategy, UnevenHostsThreeShards) { check(3, 2, 3); }
TEST(PsStrategy, ShardProcessesGiveBitIdenticalAveragesToShardsInTheLeaders) {
  Buckets in_leaders, in_processes;
  check(4, 2, 3, false, {}, {1, 3, 7, 1000, 100003, 5}, &in_leaders);
  check(4, 2, 3, true, {}, {1, 3, 7, 1000, 100003, 5}, &in_processes);
  ASSERT_EQ(in_leaders.size(), in_processes.size());
  for (size_t k = 0; k < in_leaders.size(); ++k) {
    ASSERT_EQ(0, std::memcmp(in_leaders[k].data(), in_processes[k].data(), in_leaders[k].size() * sizeof(float)))
        << "bucket " << k;
  }
}
TEST(PsStrategy, ShardProcessesOneHostTwoShards) { check(3, 1, 2, true); }
// One replica per host: requests and answers are pipelined across buckets (ps.cpp pipelined()).
TEST(PsStrategy, ShardProcessesOneReplicaPerHostPipelined) { check(4, 4, 2, true); }
TEST(PsStrategy, ShardProcessesTwoHostsOneShard) { check(4, 2, 1, true); }
TEST(PsStrategy, ShardProcessesTwoHostsFourShards) { check(4, 2, 4, true); }
TEST(PsStrategy, ShardProcessesUnevenHostsThreeShards) { check(3, 2, 3, true); }

// Ranks 0 and 2 on one host, 1 on another (what a replacement joining host 0 gives), with
// buckets of the MLP's size.
TEST(PsStrategy, InterleavedHostsAndLargeBuckets) {
  check(3, 2, 3, false, {0, 1, 0}, {2621440, 2621440, 590000});
  check(3, 2, 3, true, {0, 1, 0}, {2621440, 2621440, 590000});
}

// Update on shards: 4 ranks on 2 hosts, 2 shards; SGD with weight decay, momentum and
// dampening against the closed form, step by step. Step 3 has a NaN in shard 0's half on one
// rank: shard 0 keeps its parameters and momentum, shard 1 steps, every rank is told. The
// momentum gathered at the end is each shard's own.
void check_update_on_shards(bool nesterov, bool processes, int kSize = 4) {
  constexpr size_t kCount = 1001;
  const SgdOptions sgd{.lr = 0.5f, .momentum = 0.9f, .dampening = 0.25f, .weight_decay = 0.1f, .nesterov = nesterov};
  auto grad = [](int rank, int step, size_t i) {
    return static_cast<float>((rank + 1) * step) * 0.01f + static_cast<float>(i % 5) * 0.001f;
  };
  // The closed form, in double: the average gradient is the mean over ranks.
  std::vector<double> p(kCount), m(kCount);
  for (size_t i = 0; i < kCount; ++i) p[i] = static_cast<double>(i) * 1e-3;
  auto reference_step = [&](int step, size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      double g = 0;
      for (int r = 0; r < kSize; ++r) g += grad(r, step, i);
      g = g / kSize + sgd.weight_decay * p[i];
      m[i] = step == 1 ? g : m[i] * sgd.momentum + (1 - sgd.dampening) * g;
      p[i] -= sgd.lr * (nesterov ? g + sgd.momentum * m[i] : m[i]);
    }
  };
  reference_step(1, 0, kCount);
  reference_step(2, 0, kCount);
  reference_step(3, kCount / 2, kCount);  // shard 1 only: shard 0 = [0, kCount / 2) saw the NaN

  auto store = comm::make_memory_store();
  std::vector<std::vector<float>> params(static_cast<size_t>(kSize)), momentum(static_cast<size_t>(kSize));
  run_job(kSize, 2, 2, processes, store, [&](int rank) {
    auto s = make_ps(store, rank, kSize, 2, {.num_shards = 2, .update_on_shards = true, .shard_processes = processes});
    EXPECT_TRUE(s->server_updates() != nullptr);
    std::vector<float> mine(kCount), start(kCount);
    for (size_t i = 0; i < kCount; ++i) start[i] = static_cast<float>(i) * 1e-3f;
    bool has = true;
    s->server_updates()->gather_state_async(7, nullptr, mine.data(), kCount, &has)->wait();
    EXPECT_FALSE(has) << "momentum before any step";
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = grad(rank, step, i);
      if (step == 3 && rank == kSize - 1) data[1] = std::numeric_limits<float>::quiet_NaN();
      ShardUpdate u{.key = 7, .data = data.data(), .count = kCount, .sgd = sgd, .init = step == 1,
                    .params = start.data()};
      bool applied = false;
      s->server_updates()->update_async(u, &applied)->wait();
      EXPECT_EQ(applied, step != 3) << "step " << step << " rank " << rank;
      params[static_cast<size_t>(rank)] = data;
    }
    s->server_updates()->gather_state_async(7, nullptr, mine.data(), kCount, &has)->wait();
    EXPECT_TRUE(has);
    momentum[static_cast<size_t>(rank)] = mine;
  });
  for (int r = 0; r < kSize; ++r) {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_NEAR(params[static_cast<size_t>(r)][i], p[i], 1e-5) << "rank " << r << " element " << i;
      ASSERT_NEAR(momentum[static_cast<size_t>(r)][i], m[i], 1e-5) << "rank " << r << " element " << i;
    }
  }
}
TEST(PsStrategy, UpdateOnShardsAppliesSgdAndSkipsANonFiniteShard) { check_update_on_shards(false, false); }
TEST(PsStrategy, UpdateOnShardsAppliesNesterovSgd) { check_update_on_shards(true, false); }
TEST(PsStrategy, ShardProcessesUpdateOnShardsAppliesSgdAndSkipsANonFiniteShard) { check_update_on_shards(false, true); }
TEST(PsStrategy, ShardProcessesUpdateOnShardsAppliesNesterovSgd) { check_update_on_shards(true, true); }
TEST(PsStrategy, ShardProcessesUpdateOnShardsPipelined) { check_update_on_shards(false, true, /*kSize=*/2); }

TEST(PsStrategy, UpdatesWithoutAStartAreAnErrorNotGarbage) {
  auto store = comm::make_memory_store();
  testing::run_ranks(1, [&](int rank) {
    auto s = make_ps_strategy(make_group(store, rank, 1, 1), 1, true);
    std::vector<float> v(10, 1.0f);
    bool applied = false;
    EXPECT_THROW(
        s->server_updates()->update_async({.key = 1, .data = v.data(), .count = v.size(), .sgd = {}}, &applied)->wait(),
        Error);
    EXPECT_THROW(s->average_async(v.data(), v.size()), Error);
  });
}

TEST(PsStrategy, BadShardCountIsAConfigError) {
  auto store = comm::make_memory_store();
  testing::run_ranks(1, [&](int rank) {
    auto g = make_group(store, rank, 1, 1);
    EXPECT_THROW(make_ps_strategy(g, 0), ConfigError);
    EXPECT_THROW(make_ps_strategy(g, 65), ConfigError);
  });
}

void check_abort(bool processes) {
  auto store = comm::make_memory_store();
  run_job(2, 2, 2, processes, store, [&](int rank) {
    auto s = make_ps(store, rank, 2, 2, {.num_shards = 2, .shard_processes = processes});
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

// A 16-bit wire (compression fp16, bf16): 6 ranks on 3 hosts, 4 shards (each leader owns some,
// one owns two). Every replica gets the same bits, within the wire's rounding (twice: the push
// and the pulled average) of the average, and leaders send half float32's bytes. Each leader
// keeps what rounding its push left out (its residual, at most half a unit in the last place of
// its host's sum plus the last residual; the identity itself: ReduceKernels.EncodeSixteenBit...);
// the others keep nothing (their sums never cross hosts).
void check_sixteen_bits(comm::DataType wire, double rounding) {
  constexpr int kSize = 6, kHosts = 3, kCalls = 3;
  constexpr size_t kCount = 4099;
  auto grad = [](int rank, size_t i) {
    return 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i % 97) + 0.3337f;
  };
  std::vector<double> exact(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    for (int r = 0; r < kSize; ++r) exact[i] += grad(r, i) / kSize;
  }
  std::vector<std::vector<float>> result(kSize), residuals(kSize);
  std::vector<int64_t> bytes(kSize), float_bytes(kSize);
  auto store = comm::make_memory_store();
  run_job(kSize, kHosts, 4, false, store, [&](int rank) {
    auto s = make_ps(store, rank, kSize, kHosts, {.num_shards = 4, .wire = wire});
    EXPECT_TRUE(s->error_feedback() != nullptr);
    std::vector<float> residual(kCount, 0.0f), data(kCount);
    for (int c = 0; c < kCalls; ++c) {
      for (size_t i = 0; i < kCount; ++i) data[i] = grad(rank, i);
      s->error_feedback()
          ->average_with_feedback_async(data.data(), kCount, {.index = 0, .residual = residual.data()})
          ->wait();
    }
    result[static_cast<size_t>(rank)] = data;
    residuals[static_cast<size_t>(rank)] = residual;
    bytes[static_cast<size_t>(rank)] = s->cross_host_bytes() / kCalls;
    // The same exchange in float32, for its bytes.
    auto plain = make_ps(std::make_shared<comm::PrefixStore>(store, "f32/"), rank, kSize, kHosts, {.num_shards = 4});
    for (size_t i = 0; i < kCount; ++i) data[i] = grad(rank, i);
    plain->average_async(data.data(), kCount)->wait();
    float_bytes[static_cast<size_t>(rank)] = plain->cross_host_bytes();
  });
  double off = 0;
  for (size_t i = 0; i < kCount; ++i) off = std::max(off, std::fabs(result[0][i] - exact[i]) / exact[i]);
  std::printf("%s: %.2e from the average\n", comm::to_string(wire).c_str(), off);
  EXPECT_GT(off, 0.0);
  EXPECT_LT(off, 2 * rounding);
  for (int r = 0; r < kSize; ++r) {
    ASSERT_EQ(0, std::memcmp(result[0].data(), result[static_cast<size_t>(r)].data(), kCount * sizeof(float))) << r;
    const auto& res = residuals[static_cast<size_t>(r)];
    double largest = 0;
    for (size_t i = 0; i < kCount; ++i) {
      const double host_sum = grad(r, i) + grad(r + 1, i);  // ranks r, r + 1 share a host
      largest = std::max(largest, std::fabs(res[i]) / host_sum);
    }
    if (r % 2 == 1) {  // not a leader: sends nothing across hosts
      EXPECT_EQ(largest, 0.0) << "rank " << r;
      EXPECT_EQ(bytes[static_cast<size_t>(r)], 0);
      continue;
    }
    EXPECT_GT(largest, 0.0) << "rank " << r;
    EXPECT_LE(largest, rounding) << "rank " << r;
    EXPECT_GT(bytes[static_cast<size_t>(r)], 0);
    EXPECT_EQ(2 * bytes[static_cast<size_t>(r)], float_bytes[static_cast<size_t>(r)]) << "rank " << r;
  }
}
TEST(PsStrategy, Float16WireHalvesTheBytesAndEachLeaderKeepsWhatItsRoundingLeftOut) {
  check_sixteen_bits(comm::DataType::kFloat16, 0x1p-11);
}
TEST(PsStrategy, BFloat16WireHalvesTheBytesAndEachLeaderKeepsWhatItsRoundingLeftOut) {
  check_sixteen_bits(comm::DataType::kBFloat16, 0x1p-8);
}

TEST(PsStrategy, AbortFailsQueuedAveragesWithTheReason) { check_abort(false); }
TEST(PsStrategy, ShardProcessesAbortFailsQueuedAveragesWithTheReason) { check_abort(true); }

}  // namespace
}  // namespace dsgd::strategy
