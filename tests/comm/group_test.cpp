// Group operations with ranks as threads over real TCP on 127.0.0.1: every operation and
// algorithm against closed-form results, for 1-4 ranks, awkward sizes and every dtype.
#include "dsgd/comm/group.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "testing/allreduce_check.h"
#include "dsgd/common/error.h"
#include "testing/ranks.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;
using testing::run_ranks;

GroupOptions fast_options(milliseconds timeout = milliseconds(5000)) {
  GroupOptions o;
  o.timeout = timeout;
  return o;
}

// Forms a group of `size` thread-ranks on one in-memory store and runs fn(group) on each.
void with_group(int size, const std::function<void(Group&)>& fn, milliseconds timeout = milliseconds(5000)) {
  auto store = make_memory_store();
  run_ranks(size, [&](int rank) {
    auto group = Group::create(store, rank, size, fast_options(timeout));
    fn(*group);
  });
}

const std::vector<size_t> kCounts = {0, 1, 7, 13, 1000, 65537, 262147};

template <typename T>
void check_allreduce(Group& g, DataType type) {
  const int n = g.size();
  for (auto algorithm : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kAuto}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      for (size_t count : kCounts) {
        std::vector<T> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>((g.rank() + 1) * static_cast<int>(i % 7 + 1));
        g.allreduce(v.data(), count, type, op, algorithm);
        for (size_t i = 0; i < count; ++i) {
          const T base = static_cast<T>(i % 7 + 1);
          const T sum = base * static_cast<T>(n * (n + 1) / 2);
          const T expected = op == ReduceOp::kSum   ? sum
                             : op == ReduceOp::kMax ? base * static_cast<T>(n)
                                                    : sum / static_cast<T>(n);
          if (v[i] != expected) {
            FAIL() << "rank " << g.rank() << "/" << n << " " << to_string(type) << " " << to_string(op) << " "
                   << to_string(algorithm) << " count " << count << ": element " << i << " is " << v[i]
                   << ", expected " << expected;
          }
        }
      }
    }
  }
}


class GroupSizes : public ::testing::TestWithParam<int> {};

TEST_P(GroupSizes, AllreduceSixteenBitTypesInFloat32) {
  with_group(GetParam(), [](Group& g) {
    for (auto type : {DataType::kFloat16, DataType::kBFloat16}) {
      for (auto algorithm : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kHalvingDoubling}) {
        check_allreduce_16(g.rank(), g.size(), type, [&](uint16_t* data, size_t count, ReduceOp op) {
          g.allreduce(data, count, type, op, algorithm);
        });
      }
    }
  });
}


TEST_P(GroupSizes, RanksHostsAndLocalRanks) {
  with_group(GetParam(), [](Group& g) {
    EXPECT_EQ(g.size(), GetParam());
    std::vector<int> all(static_cast<size_t>(g.size()));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(g.local_ranks(), all);
    EXPECT_FALSE(g.host(0).empty());
  });
}

TEST_P(GroupSizes, AllreduceEveryDtypeOpAlgorithmAndSize) {
  with_group(GetParam(), [](Group& g) {
    check_allreduce<float>(g, DataType::kFloat32);
    check_allreduce<double>(g, DataType::kFloat64);
    check_allreduce<int64_t>(g, DataType::kInt64);
  });
}

TEST_P(GroupSizes, BroadcastFromEveryRoot) {
  with_group(GetParam(), [](Group& g) {
    for (int root = 0; root < g.size(); ++root) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{1} << 20}) {
        std::vector<uint8_t> v(bytes, static_cast<uint8_t>(g.rank() == root ? 0 : 0xee));
        if (g.rank() == root) {
          for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 31 + root);
        }
        g.broadcast(v.data(), bytes, root);
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(v[i], static_cast<uint8_t>(i * 31 + root)) << "root " << root << " bytes " << bytes << " at " << i;
        }
      }
    }
  });
}

TEST_P(GroupSizes, AllgatherInRankOrder) {
  with_group(GetParam(), [](Group& g) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{100003}}) {
      std::vector<uint8_t> in(bytes);
      for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<uint8_t>(g.rank() * 7 + i);
      std::vector<uint8_t> out(bytes * static_cast<size_t>(g.size()), 0xee);
      g.allgather(in.data(), out.data(), bytes);
      for (int r = 0; r < g.size(); ++r) {
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(out[r * bytes + i], static_cast<uint8_t>(r * 7 + i)) << "block " << r << " bytes " << bytes;
        }
      }
    }
  });
}

TEST_P(GroupSizes, ReduceScatterKeepsThisRanksBlock) {
  with_group(GetParam(), [](Group& g) {
    const int n = g.size();
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1001}}) {
      std::vector<double> in(count * static_cast<size_t>(n));
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<double>((g.rank() + 1) * (i + 1));
      std::vector<double> out(count, -1);
      g.reduce_scatter(in.data(), out.data(), count, DataType::kFloat64, ReduceOp::kSum);
      for (size_t j = 0; j < count; ++j) {
        const size_t i = static_cast<size_t>(g.rank()) * count + j;
        ASSERT_EQ(out[j], static_cast<double>((i + 1) * static_cast<size_t>(n * (n + 1) / 2))) << "count " << count;
      }
      std::vector<int64_t> ones(count * static_cast<size_t>(n), 4), avg(count);
      g.reduce_scatter(ones.data(), avg.data(), count, DataType::kInt64, ReduceOp::kAverage);
      for (int64_t x : avg) ASSERT_EQ(x, 4);
      std::vector<float> f(count * static_cast<size_t>(n)), most(count);
      for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>((g.rank() + 1) * static_cast<int>(i % 3 + 1));
      g.reduce_scatter(f.data(), most.data(), count, DataType::kFloat32, ReduceOp::kMax);
      for (size_t j = 0; j < count; ++j) {
        const size_t i = static_cast<size_t>(g.rank()) * count + j;
        ASSERT_EQ(most[j], static_cast<float>(n * static_cast<int>(i % 3 + 1))) << "count " << count;
      }
    }
  });
}

TEST_P(GroupSizes, BarrierWaitsForTheLastRank) {
  std::atomic<int64_t> last_arrival_ns{0};
  with_group(GetParam(), [&](Group& g) {
    if (g.rank() == g.size() - 1) {
      std::this_thread::sleep_for(milliseconds(150));
      last_arrival_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    }
    g.barrier();
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    EXPECT_GE(now, last_arrival_ns.load());
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GroupSizes, ::testing::Values(1, 2, 3, 4));

TEST(Group, SendRecvBothWaysAndOutOfTagOrder) {
  with_group(2, [](Group& g) {
    const int peer = 1 - g.rank();
    std::vector<int64_t> out1(1000, g.rank() + 10), out2(3, g.rank() + 20);
    std::vector<int64_t> in1(1000), in2(3);
    // Both ranks send first: posting is immediate, so neither waits on the other's queue.
    auto s1 = g.send_async(out1.data(), out1.size() * 8, peer, 1);
    auto s2 = g.send_async(out2.data(), out2.size() * 8, peer, 2);
    g.recv(in2.data(), in2.size() * 8, peer, 2);  // tag 2 before tag 1
    g.recv(in1.data(), in1.size() * 8, peer, 1);
    s1->wait();
    s2->wait();
    EXPECT_EQ(in1[999], peer + 10);
    EXPECT_EQ(in2[0], peer + 20);
  });
}

TEST(Group, ManyQueuedAsyncOperationsCompleteInOrderWithCorrectResults) {
  with_group(3, [](Group& g) {
    constexpr int kOps = 60;
    std::vector<std::vector<float>> bufs(kOps);
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      bufs[k].assign(static_cast<size_t>(100 + k * 37), static_cast<float>(k + g.rank()));
      works.push_back(g.allreduce_async(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kSum,
                                        k % 2 ? AllreduceAlgorithm::kRing : AllreduceAlgorithm::kAuto));
    }
    for (int k = kOps - 1; k >= 0; --k) works[k]->wait();  // waiting in reverse changes nothing
    for (int k = 0; k < kOps; ++k) {
      EXPECT_TRUE(works[k]->test());
      EXPECT_EQ(bufs[k].front(), static_cast<float>(3 * k + 3)) << "op " << k;
      EXPECT_EQ(bufs[k].back(), static_cast<float>(3 * k + 3)) << "op " << k;
    }
    EXPECT_NE(works[5]->description().find("allreduce #5"), std::string::npos) << works[5]->description();
  });
}

TEST(Group, RecvFromSilentPeerTimesOutNamingIt) {
  with_group(2, [](Group& g) {
    if (g.rank() == 0) {
      int64_t x = 0;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        g.recv(&x, sizeof(x), 1, 9, milliseconds(300));
        ADD_FAILURE() << "recv returned with no sender";
      } catch (const TimeoutError& e) {
        EXPECT_EQ(e.peer(), 1);
        EXPECT_NE(std::string(e.what()).find("recv from rank 1"), std::string::npos) << e.what();
      }
      const auto waited = std::chrono::steady_clock::now() - t0;
      EXPECT_GE(waited, milliseconds(250));
      EXPECT_LT(waited, milliseconds(3000));
      // Sticky: the group is unusable after a failure.
      EXPECT_THROW(g.barrier(), CommError);
    }
    if (g.rank() == 1) std::this_thread::sleep_for(milliseconds(800));  // alive but silent
  });
}

TEST(Group, AGroupOfOneWorksAndAbortsCleanly) {
  auto g = Group::create(make_memory_store(), 0, 1);
  float x = 3;
  g->allreduce(&x, 1, DataType::kFloat32, ReduceOp::kAverage);
  EXPECT_EQ(x, 3);
  g->abort("done");  // no transport to close: must not throw
  EXPECT_THROW(g->barrier(), CommError);
}

TEST(Group, AbortFromAnotherThreadUnblocksAWaitingRecvAndCollective) {
  std::atomic<bool> done{false};
  with_group(2, [&](Group& g) {
    if (g.rank() == 1) {  // alive, but never communicates
      while (!done) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    int64_t x = 0;
    auto recv = g.recv_async(&x, sizeof(x), 1, 3, milliseconds(60000));
    auto allreduce = g.allreduce_async(&x, 1, DataType::kInt64, ReduceOp::kSum, AllreduceAlgorithm::kRing,
                                       milliseconds(60000));
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(100));
      g.abort("test abort");
    });
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(recv->wait(milliseconds(5000)), CommError);
    EXPECT_THROW(allreduce->wait(milliseconds(5000)), CommError);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
    aborter.join();
    try {
      g.barrier();
      ADD_FAILURE() << "barrier on an aborted group";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("group aborted: test abort"), std::string::npos) << e.what();
    }
    done = true;
  });
}

TEST(Group, RendezvousTimesOutNamingMissingRanks) {
  auto store = make_memory_store();
  try {
    Group::create(store, 0, 3, fast_options(milliseconds(300)));
    FAIL() << "formed a group of 3 with one rank";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 of 3 did not arrive within 300 ms"), std::string::npos)
        << e.what();
  }
}

// auto: halving-doubling on power-of-two groups up to 256 KiB, or 128 KiB per dependent step it
// saves over the ring (2(n-1) - 2 log2 n) where that is more; the ring otherwise. An explicit
// halving-doubling needs a power of two; an explicit choice is otherwise kept.
TEST(Group, AutoChoosesHalvingDoublingUpToASizeThatGrowsWithTheStepsItSaves) {
  constexpr size_t KiB = 1024;
  const auto hd = AllreduceAlgorithm::kHalvingDoubling, ring = AllreduceAlgorithm::kRing;
  auto resolve = [](int ranks, size_t bytes) {
    return resolve_allreduce_algorithm(AllreduceAlgorithm::kAuto, ranks, bytes);
  };
  EXPECT_EQ(resolve(2, 4), hd);
  EXPECT_EQ(resolve(2, 256 * KiB), hd);
  EXPECT_EQ(resolve(2, 256 * KiB + 1), ring);
  EXPECT_EQ(resolve(4, 256 * KiB), hd);  // saves 2 steps: 256 KiB still
  EXPECT_EQ(resolve(4, 256 * KiB + 1), ring);
  EXPECT_EQ(resolve(8, 1024 * KiB), hd);  // saves 8 steps
  EXPECT_EQ(resolve(8, 1024 * KiB + 1), ring);
  EXPECT_EQ(resolve(16, 22 * 128 * KiB), hd);  // saves 22 steps
  EXPECT_EQ(resolve(16, 22 * 128 * KiB + 1), ring);
  for (int n : {1, 3, 6, 12}) EXPECT_EQ(resolve(n, 4), ring) << n << " ranks";
  EXPECT_EQ(resolve_allreduce_algorithm(hd, 6, 4), ring);
  EXPECT_EQ(resolve_allreduce_algorithm(hd, 8, 64 * 1024 * KiB), hd);
  EXPECT_EQ(resolve_allreduce_algorithm(ring, 2, 4), ring);
}

TEST(Group, BadArgumentsAreConfigErrors) {
  auto store = make_memory_store();
  EXPECT_THROW(Group::create(store, 2, 2), ConfigError);
  EXPECT_THROW(Group::create(store, 0, 0), ConfigError);
  with_group(2, [](Group& g) {
    int x = 0;
    EXPECT_THROW(g.send(&x, 4, g.rank(), 0), ConfigError);
    EXPECT_THROW(g.recv(&x, 4, 5, 0), ConfigError);
    EXPECT_THROW(g.broadcast(&x, 4, -1), ConfigError);
  });
}

TEST(Group, MismatchedSizesAreNamed) {
  auto store = make_memory_store();
  try {
    run_ranks(2, [&](int rank) { Group::create(store, rank, rank == 0 ? 2 : 3, fast_options(milliseconds(500))); });
    FAIL() << "ranks disagreeing on the size formed a group";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expects a group of"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsgd::comm

namespace dsgd::comm {
namespace {

TEST(Group, ReformsUnderANewGenerationAfterAFailure) {
  auto store = make_memory_store();
  testing::run_ranks(3, [&](int rank) {
    auto gen1 = Group::create(std::make_shared<PrefixStore>(store, "job7/gen1/"), rank, 3, fast_options());
    int64_t x = rank;
    gen1->allreduce(&x, 1, DataType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(x, 3);
    gen1->abort("rank lost");  // as the runtime would on a failure
    EXPECT_THROW(gen1->barrier(), CommError);
    gen1.reset();
    // The same store, a new generation: nothing of gen1 is read, and the new group works.
    auto gen2 = Group::create(std::make_shared<PrefixStore>(store, "job7/gen2/"), rank, 3, fast_options());
    x = rank + 10;
    gen2->allreduce(&x, 1, DataType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(x, 33);
  });
}

}  // namespace
}  // namespace dsgd::comm

namespace dsgd::comm {
namespace {

// A synchronous call queued behind long but healthy operations must wait for them, not time out
// on a timer of its own (its deadline counts from when it starts).
TEST(Group, SyncCallQueuedBehindSlowOperationsDoesNotTimeOutSpuriously) {
  testing::run_ranks(2, [store = make_memory_store()](int rank) {
    auto g = Group::create(store, rank, 2, fast_options());
    int64_t a = 1, b = 2;
    const milliseconds op_timeout(5000);
    if (rank == 1) {  // joins each operation 2.8 s late
      std::this_thread::sleep_for(milliseconds(2800));
      g->allreduce(&a, 1, DataType::kInt64, ReduceOp::kSum, AllreduceAlgorithm::kRing, op_timeout);
      std::this_thread::sleep_for(milliseconds(2800));
      g->allreduce(&b, 1, DataType::kInt64, ReduceOp::kSum, AllreduceAlgorithm::kRing, op_timeout);
      g->barrier();
      return;
    }
    auto wa = g->allreduce_async(&a, 1, DataType::kInt64, ReduceOp::kSum, AllreduceAlgorithm::kRing, op_timeout);
    auto wb = g->allreduce_async(&b, 1, DataType::kInt64, ReduceOp::kSum, AllreduceAlgorithm::kRing, op_timeout);
    g->barrier(milliseconds(100));  // starts ~5.6 s after it was called, then completes at once
    EXPECT_TRUE(wa->test());
    EXPECT_TRUE(wb->test());
    EXPECT_EQ(a, 2);
    EXPECT_EQ(b, 4);
  });
}

}  // namespace
}  // namespace dsgd::comm
