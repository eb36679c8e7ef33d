// Hierarchical allreduce with ranks as threads split into pseudo-hosts (GroupOptions::host): the
// shared-memory stage within a host, Gloo among leaders, against closed forms.
#include "dsgd/comm/hierarchical.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_sent (Linux 4.19); glibc's lacks it
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/reduce_kernels.h"
#include "dsgd/common/error.h"
#include "testing/ranks.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;

// shared: the data lives in the host's shared memory (take_shared) where the host has several ranks.
void check(int size, int hosts, bool shared = false) {
  constexpr size_t kMaxCount = 100003;
  auto store = make_memory_store();
  testing::run_ranks(size, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(5000);
    o.host = "host" + std::to_string(rank * hosts / size);
    ShmOptions so;
    so.slot_bytes = 64 << 10;
    if (shared) so.shared_bytes = kMaxCount * sizeof(double);
    auto h = HierarchicalGroup::create(store, rank, size, o, so);
    EXPECT_EQ(h->num_hosts(), hosts);
    EXPECT_EQ(h->leaders() != nullptr, hosts > 1 && h->local().rank() == 0);
    auto* in_shared = static_cast<double*>(shared ? h->take_shared(kMaxCount * sizeof(double)) : nullptr);
    EXPECT_EQ(in_shared != nullptr, shared && h->local().size() > 1);
    std::vector<double> heap(kMaxCount);
    double* v = in_shared != nullptr ? in_shared : heap.data();
    for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, kMaxCount}) {
        for (size_t i = 0; i < count; ++i) v[i] = (rank + 1) * static_cast<double>(i % 5 + 1);
        h->allreduce(v, count, DataType::kFloat64, op);
        for (size_t i = 0; i < count; ++i) {
          const double base = static_cast<double>(i % 5 + 1);
          const double sum = base * size * (size + 1) / 2;
          const double expected = op == ReduceOp::kSum ? sum : op == ReduceOp::kMax ? base * size : sum / size;
          ASSERT_DOUBLE_EQ(v[i], expected) << "size " << size << " hosts " << hosts << " " << to_string(op)
                                           << " count " << count << " element " << i;
        }
      }
    }
  });
}

TEST(Hierarchical, OneHost) { check(3, 1); }
TEST(Hierarchical, TwoHostsOfTwo) { check(4, 2); }
TEST(Hierarchical, UnevenHosts) { check(3, 2); }  // hosts of 2 and 1 ranks
TEST(Hierarchical, OneRankPerHost) { check(3, 3); }
TEST(Hierarchical, OneRank) { check(1, 1); }
TEST(Hierarchical, OneHostDataInSharedMemory) { check(3, 1, true); }
TEST(Hierarchical, TwoHostsOfTwoDataInSharedMemory) { check(4, 2, true); }
TEST(Hierarchical, UnevenHostsDataInSharedMemory) { check(3, 2, true); }

// ZeRO's halves: rank q's block b, element i, is (q + 1) * (b + 1) * (i % 5 + 1); rank r's
// reduce-scatter gets block r reduced over the ranks, its allgather every rank's bytes in rank
// order. Leaders count (h-1) hosts' blocks (padded to the largest host) each way.
void check_halves(int size, int hosts) {
  auto store = make_memory_store();
  testing::run_ranks(size, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(5000);
    o.host = "host" + std::to_string(rank * hosts / size);
    ShmOptions so;
    so.slot_bytes = 64 << 10;
    auto h = HierarchicalGroup::create(store, rank, size, o, so);
    const size_t n = static_cast<size_t>(size), r = static_cast<size_t>(rank);
    for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{40001}}) {
        std::vector<double> in(n * count), out(count, -1);
        for (size_t b = 0; b < n; ++b) {
          for (size_t i = 0; i < count; ++i) in[b * count + i] = static_cast<double>((r + 1) * (b + 1) * (i % 5 + 1));
        }
        const uint64_t sent = h->cross_host_bytes();
        h->reduce_scatter_async(in.data(), out.data(), count, DataType::kFloat64, op)->wait();
        if (h->leaders() != nullptr) {
          const size_t most = (n + static_cast<size_t>(hosts) - 1) / static_cast<size_t>(hosts);
          EXPECT_EQ(h->cross_host_bytes() - sent, static_cast<uint64_t>(hosts - 1) * most * count * sizeof(double));
        }
        for (size_t i = 0; i < count; ++i) {
          const double base = static_cast<double>((r + 1) * (i % 5 + 1));
          const double sum = base * static_cast<double>(n * (n + 1) / 2);
          const double expected = op == ReduceOp::kSum ? sum : op == ReduceOp::kMax ? base * size : sum / size;
          ASSERT_DOUBLE_EQ(out[i], expected) << "size " << size << " hosts " << hosts << " " << to_string(op)
                                             << " count " << count << " element " << i;
        }
      }
    }
    for (size_t bytes : {size_t{0}, size_t{3}, size_t{100003}}) {
      std::vector<uint8_t> mine(bytes), all(n * bytes, 0xee);
      for (size_t j = 0; j < bytes; ++j) mine[j] = static_cast<uint8_t>(j * 7 + r * 31);
      h->allgather_async(mine.data(), all.data(), bytes)->wait();
      for (size_t q = 0; q < n; ++q) {
        for (size_t j = 0; j < bytes; ++j) {
          ASSERT_EQ(all[q * bytes + j], static_cast<uint8_t>(j * 7 + q * 31))
              << "size " << size << " hosts " << hosts << " rank " << rank << " block " << q << " byte " << j;
        }
      }
    }
  });
}

TEST(Hierarchical, ReduceScatterAndAllgatherOnOneHost) { check_halves(3, 1); }
TEST(Hierarchical, ReduceScatterAndAllgatherOnTwoHostsOfTwo) { check_halves(4, 2); }
TEST(Hierarchical, ReduceScatterAndAllgatherOnUnevenHosts) { check_halves(3, 2); }  // hosts of 2 and 1
TEST(Hierarchical, ReduceScatterAndAllgatherOnOneRankPerHost) { check_halves(3, 3); }
TEST(Hierarchical, ReduceScatterAndAllgatherOnOneRank) { check_halves(1, 1); }

// take_shared hands out the region in call order, 64-byte aligned, the same offsets on every
// rank of a host, and null once it is used up.
TEST(Hierarchical, TakeSharedGivesTheSameAlignedOffsetsOnEveryRankUntilFull) {
  auto store = make_memory_store();
  std::vector<std::vector<ptrdiff_t>> offsets(2);
  testing::run_ranks(2, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(5000);
    ShmOptions so;
    so.shared_bytes = 8192;
    auto h = HierarchicalGroup::create(store, rank, 2, o, so);
    auto* base = static_cast<char*>(h->local().shared_buffer());
    ASSERT_NE(base, nullptr);
    for (size_t bytes : {size_t{100}, size_t{4}, size_t{4000}, size_t{3900}}) {
      auto* p = static_cast<char*>(h->take_shared(bytes));
      ASSERT_NE(p, nullptr) << bytes;
      offsets[static_cast<size_t>(rank)].push_back(p - base);
    }
    EXPECT_EQ(h->take_shared(200), nullptr);  // 128 + 64 + 4032 + 3904 = 8128 of 8192 taken
    EXPECT_NE(h->take_shared(64), nullptr);
  });
  EXPECT_EQ(offsets[0], (std::vector<ptrdiff_t>{0, 128, 192, 4224}));
  EXPECT_EQ(offsets[0], offsets[1]);
}

// One rank per host: allreduce_async calls alternate between two lanes, many in flight at once,
// of different sizes (so later ones may finish first), each with its own right answer; and
// abort() fails both lanes.
TEST(Hierarchical, OneRankPerHostRunsAsyncCallsOnTwoLanes) {
  auto store = make_memory_store();
  testing::run_ranks(3, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(5000);
    o.host = "host" + std::to_string(rank);
    auto h = HierarchicalGroup::create(store, rank, 3, o);
    std::vector<std::vector<float>> bufs;
    std::vector<std::shared_ptr<Work>> works;
    for (size_t k = 0; k < 24; ++k) {
      bufs.emplace_back(k % 2 == 0 ? 200003 : 17, static_cast<float>((rank + 1) * (k + 1)));
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      works.push_back(h->allreduce_async(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kAverage));
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      works[k]->wait();
      const float expected = 2.0f * static_cast<float>(k + 1);  // (1 + 2 + 3) / 3 x (k + 1)
      for (float x : bufs[k]) ASSERT_FLOAT_EQ(x, expected) << "call " << k;
    }
    h->abort("test over");
    std::vector<float> v(10, 1.0f);
    for (int k = 0; k < 2; ++k) {  // one call on each lane
      EXPECT_THROW(h->allreduce_async(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum)->wait(), CommError);
    }
  });
}

// The across-host stage in 16 bits (CrossHostWire), on hosts of 2, 1 and 2 ranks and on one
// rank per host (the lanes): every rank ends with the same bits; each leader's error feedback
// holds exactly what its rounding left out (so the average plus the leaders' residuals, spread
// over the ranks, is the float32 average up to the second rounding); the leaders' count of
// bytes sent to other hosts is half the float32 ring's for the same data.
void check_compressed(int size, int hosts, DataType wire) {
  constexpr size_t kCount = 10007;
  auto store = make_memory_store();
  std::vector<std::vector<float>> results(static_cast<size_t>(size));
  std::vector<uint64_t> bytes_fp32(static_cast<size_t>(size)), bytes_wire(static_cast<size_t>(size));
  testing::run_ranks(size, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(5000);
    o.host = "host" + std::to_string(rank * hosts / size);
    auto h = HierarchicalGroup::create(store, rank, size, o);
    auto value = [](int r, size_t i) { return std::sin(static_cast<float>(i * 7 + static_cast<size_t>(r))) / 3.0f; };
    std::vector<float> v(kCount);
    for (size_t i = 0; i < kCount; ++i) v[i] = value(rank, i);
    h->allreduce_async(v.data(), kCount, DataType::kFloat32, ReduceOp::kAverage)->wait();
    const std::vector<float> exact = v;
    bytes_fp32[static_cast<size_t>(rank)] = h->cross_host_bytes();
    std::vector<float> residual(kCount, 0.0f);
    for (size_t i = 0; i < kCount; ++i) v[i] = value(rank, i);
    h->allreduce_async(v.data(), kCount, DataType::kFloat32, ReduceOp::kAverage, {},
                       {.type = wire, .residual = residual.data()})
        ->wait();
    bytes_wire[static_cast<size_t>(rank)] = h->cross_host_bytes() - bytes_fp32[static_cast<size_t>(rank)];
    results[static_cast<size_t>(rank)] = v;
    const bool leader = h->local().rank() == 0;
    const float tolerance = wire == DataType::kFloat16 ? 2e-3f : 1.6e-2f;
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_NEAR(v[i], exact[i], tolerance) << "element " << i;
      if (!leader) {
        ASSERT_EQ(residual[i], 0.0f) << "only leaders send across hosts";
      }
    }
  });
  for (int r = 1; r < size; ++r) EXPECT_EQ(results[static_cast<size_t>(r)], results[0]) << "rank " << r;
  for (int r = 0; r < size; ++r) {
    const auto fp32 = bytes_fp32[static_cast<size_t>(r)], sent = bytes_wire[static_cast<size_t>(r)];
    if (fp32 == 0) {
      EXPECT_EQ(sent, 0u) << "rank " << r;
      continue;
    }
    const double ratio = static_cast<double>(fp32) / static_cast<double>(sent);
    EXPECT_NEAR(ratio, 2.0, 0.01) << "rank " << r << ": " << fp32 << " bytes in float32, " << sent << " compressed";
  }
}

// Bytes the kernel has sent on every TCP socket of this process (TCP_INFO's tcpi_bytes_sent:
// payload, Gloo's headers included), less those it sent again (tcpi_bytes_retrans: a loaded
// machine's loopback retransmits now and then, and 1 run in 10 failed by 3%), the ground truth
// beside the groups' own counts.
uint64_t tcp_bytes_sent_by_this_process() {
  uint64_t total = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (const dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == ::dirfd(dir)) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    const bool read = ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0;
    if (read && len >= offsetof(tcp_info, tcpi_bytes_retrans) + 8) {
      total += info.tcpi_bytes_sent - info.tcpi_bytes_retrans;
    }
  }
  ::closedir(dir);
  return total;
}

// `size` groups made together and kept for calls after, `per_host` consecutive ranks a host.
std::vector<std::unique_ptr<HierarchicalGroup>> groups_on_hosts(int size, int per_host) {
  auto store = make_memory_store();
  std::vector<std::unique_ptr<HierarchicalGroup>> groups(static_cast<size_t>(size));
  testing::run_ranks(size, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(10000);
    o.host = "host" + std::to_string(rank / per_host);
    groups[static_cast<size_t>(rank)] = HierarchicalGroup::create(store, rank, size, o);
  });
  return groups;
}

// The compression checks above compare the groups' own counts (cross_host_bytes). Here the
// kernel counts what the two host leaders' sockets really sent: the 16-bit wire sends half the
// float32 ring's bytes, and cross_host_bytes agrees with the sockets within Gloo's headers.
TEST(Hierarchical, TheSocketsSendHalfTheBytesWithA16BitWireAndAsMuchAsCounted) {
  constexpr size_t kCount = 1 << 20;  // 4 MB a call: Gloo's per-message headers are noise
  constexpr int kCalls = 3;
  std::vector<uint64_t> counted_fp32(2), counted_fp16(2);
  uint64_t sent_fp32 = 0, sent_fp16 = 0;
  auto groups = groups_on_hosts(2, 1);
  std::vector<std::vector<float>> data(2, std::vector<float>(kCount, 0.25f)), residual(2, std::vector<float>(kCount));
  const auto run = [&](DataType wire, std::vector<uint64_t>& counted) {
    const uint64_t before = tcp_bytes_sent_by_this_process();
    testing::run_ranks(2, [&](int rank) {
      auto& h = *groups[static_cast<size_t>(rank)];
      const uint64_t c0 = h.cross_host_bytes();
      for (int i = 0; i < kCalls; ++i) {
        h.allreduce_async(data[static_cast<size_t>(rank)].data(), kCount, DataType::kFloat32, ReduceOp::kAverage, {},
                          {.type = wire, .residual = residual[static_cast<size_t>(rank)].data()})
            ->wait();
      }
      counted[static_cast<size_t>(rank)] = h.cross_host_bytes() - c0;
    });
    return tcp_bytes_sent_by_this_process() - before;
  };
  sent_fp32 = run(DataType::kFloat32, counted_fp32);
  sent_fp16 = run(DataType::kFloat16, counted_fp16);
  groups.clear();
  const double payload_fp32 = 2.0 * kCalls * kCount * sizeof(float);  // 2 leaders, a ring of 2: B each way
  ASSERT_GT(sent_fp32, payload_fp32 * 0.99) << "the sockets sent less than the data: is TCP_INFO counting?";
  EXPECT_NEAR(static_cast<double>(sent_fp32) / static_cast<double>(sent_fp16), 2.0, 0.04)
      << sent_fp32 << " bytes on the sockets in float32, " << sent_fp16 << " with the float16 wire";
  EXPECT_NEAR(static_cast<double>(counted_fp32[0] + counted_fp32[1]) / static_cast<double>(sent_fp32), 1.0, 0.02);
  EXPECT_NEAR(static_cast<double>(counted_fp16[0] + counted_fp16[1]) / static_cast<double>(sent_fp16), 1.0, 0.02);
}

// ZeRO's halves on the sockets: on 2 hosts of 2 ranks, a reduce-scatter of B bytes a rank and the
// allgather of its result together send what one allreduce of B sends (each half of it), and
// cross_host_bytes agrees with the sockets.
TEST(Hierarchical, TheSocketsSendAsMuchForAReduceScatterAndAnAllgatherAsForOneAllreduce) {
  constexpr size_t kCount = 1 << 20;  // floats a rank: 4 MB, Gloo's per-message headers are noise
  constexpr int kCalls = 3, kRanks = 4;
  auto groups = groups_on_hosts(kRanks, 2);
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(kCount, 0.25f));
  std::vector<std::vector<float>> part(kRanks, std::vector<float>(kCount / kRanks));
  const auto run = [&](bool halves) {
    const uint64_t before = tcp_bytes_sent_by_this_process();
    uint64_t total = 0;
    std::mutex m;
    testing::run_ranks(kRanks, [&](int rank) {
      auto& h = *groups[static_cast<size_t>(rank)];
      auto& d = data[static_cast<size_t>(rank)];
      auto& p = part[static_cast<size_t>(rank)];
      const uint64_t c0 = h.cross_host_bytes();
      for (int i = 0; i < kCalls; ++i) {
        if (halves) {
          h.reduce_scatter_async(d.data(), p.data(), p.size(), DataType::kFloat32, ReduceOp::kAverage)->wait();
          h.allgather_async(p.data(), d.data(), p.size() * sizeof(float))->wait();
        } else {
          h.allreduce_async(d.data(), d.size(), DataType::kFloat32, ReduceOp::kAverage)->wait();
        }
      }
      for (float x : d) ASSERT_FLOAT_EQ(x, 0.25f);
      std::lock_guard<std::mutex> lock(m);
      total += h.cross_host_bytes() - c0;
    });
    return std::make_pair(tcp_bytes_sent_by_this_process() - before, total);
  };
  const auto [sent_allreduce, counted_allreduce] = run(false);
  const auto [sent_halves, counted_halves] = run(true);
  groups.clear();
  const double payload = 2.0 * kCalls * kCount * sizeof(float);  // 2 leaders, 2 hosts: B each way
  ASSERT_GT(static_cast<double>(sent_allreduce), payload * 0.99) << "is TCP_INFO counting?";
  EXPECT_NEAR(static_cast<double>(sent_halves) / static_cast<double>(sent_allreduce), 1.0, 0.04)
      << sent_halves << " bytes on the sockets for the halves, " << sent_allreduce << " for the allreduce";
  EXPECT_NEAR(static_cast<double>(counted_halves) / static_cast<double>(sent_halves), 1.0, 0.02);
  EXPECT_NEAR(static_cast<double>(counted_allreduce) / static_cast<double>(sent_allreduce), 1.0, 0.02);
}

TEST(Hierarchical, Float16AcrossHostsHalvesTheBytesAndEveryRankGetsTheSameBits) {
  check_compressed(5, 3, DataType::kFloat16);  // hosts of 2, 1 and 2 ranks
}
TEST(Hierarchical, BFloat16AcrossHostsOnOneRankPerHost) { check_compressed(3, 3, DataType::kBFloat16); }

// The leaders' residual: their host's float32 sum minus what they sent, exactly.
TEST(Hierarchical, ALeadersResidualIsWhatItsRoundingLeftOut) {
  constexpr size_t kCount = 999;
  auto store = make_memory_store();
  testing::run_ranks(2, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(5000);
    o.host = "host" + std::to_string(rank);
    auto h = HierarchicalGroup::create(store, rank, 2, o);
    std::vector<float> v(kCount), residual(kCount), old(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      v[i] = 1.0f + static_cast<float>(i) * 1e-4f * static_cast<float>(rank + 1);
      residual[i] = old[i] = static_cast<float>(i % 3) * 1e-4f;
    }
    const std::vector<float> grad = v;
    h->allreduce(v.data(), kCount, DataType::kFloat32, ReduceOp::kSum, {},
                 {.type = DataType::kFloat16, .residual = residual.data()});
    // What this leader sent: grad + old residual, rounded; float16 has 1024 steps in [1, 2).
    for (size_t i = 0; i < kCount; ++i) {
      const float sent = half_to_float(float_to_half(grad[i] + old[i]));
      ASSERT_EQ(sent + residual[i], grad[i] + old[i]) << i;
    }
  });
}

// abort() fails an operation the other ranks never join at once (`op`, started by `start` on rank
// 0 over 4000-float buffers), naming the reason, long before its deadline; and stays failed.
void check_abort_fails(const std::string& op,
                       const std::function<std::shared_ptr<Work>(HierarchicalGroup&, float*, float*)>& start) {
  auto store = make_memory_store();
  testing::run_ranks(4, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(20000);
    o.host = "host" + std::to_string(rank / 2);
    auto h = HierarchicalGroup::create(store, rank, 4, o);
    if (rank != 0) {
      std::this_thread::sleep_for(milliseconds(800));
      return;
    }
    std::vector<float> in(4000, 1.0f), out(4000);
    auto w = start(*h, in.data(), out.data());
    std::this_thread::sleep_for(milliseconds(100));
    const auto t0 = std::chrono::steady_clock::now();
    h->abort("worker 3 was lost");
    try {
      w->wait();
      ADD_FAILURE() << op << " that nobody else joined succeeded";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("worker 3 was lost"), std::string::npos) << op << ": " << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000)) << op;
    EXPECT_THROW(h->allreduce(in.data(), 1000, DataType::kFloat32, ReduceOp::kSum), CommError) << op;
  });
}

TEST(Hierarchical, AbortFailsTheAllreduceInFlightNamingTheReason) {
  check_abort_fails("allreduce", [](HierarchicalGroup& h, float* in, float*) {
    return h.allreduce_async(in, 1000, DataType::kFloat32, ReduceOp::kAverage);
  });
}

TEST(Hierarchical, AbortFailsAReduceScatterAndAnAllgatherInFlightNamingTheReason) {
  check_abort_fails("reduce_scatter", [](HierarchicalGroup& h, float* in, float* out) {
    return h.reduce_scatter_async(in, out, 1000, DataType::kFloat32, ReduceOp::kSum);
  });
  check_abort_fails("allgather", [](HierarchicalGroup& h, float* in, float* out) {
    return h.allgather_async(in, out, 1000 * sizeof(float));
  });
}

// broadcast() from every root, on hosts of uneven sizes (3, 1 and 2 ranks; the root's host, its
// leader or not, and hosts of one rank), in more than one shared-memory slot: every rank ends
// with the root's bytes, and the full mesh is never formed.
TEST(Hierarchical, ABroadcastFromAnyRootReachesEveryHost) {
  constexpr int kSize = 6;
  const std::vector<int> host_of{0, 0, 1, 0, 2, 2};  // rank 3 is host0's third rank, not its leader
  auto store = make_memory_store();
  testing::run_ranks(kSize, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(10000);
    o.host = "host" + std::to_string(host_of[static_cast<size_t>(rank)]);
    ShmOptions so;
    so.slot_bytes = 4 << 10;
    auto h = HierarchicalGroup::create(store, rank, kSize, o, so);
    std::vector<uint8_t> data(10001);
    for (int root = 0; root < kSize; ++root) {
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(rank == root ? (i * 7 + root) : 0xee);
      h->broadcast(data.data(), data.size(), root);
      for (size_t i = 0; i < data.size(); ++i) {
        ASSERT_EQ(data[i], static_cast<uint8_t>(i * 7 + root)) << "rank " << rank << " root " << root << " byte " << i;
      }
    }
    EXPECT_FALSE(store->check({"global/rank/" + std::to_string(rank)})) << "the broadcast formed the full mesh";
    EXPECT_THROW(h->broadcast(data.data(), 1, kSize), ConfigError);
  });
}

// The full mesh of every rank is formed only when global() is first called: the hierarchy's
// allreduce never forms it; a broadcast on it does; after abort() it is refused, naming why.
TEST(Hierarchical, TheGlobalGroupIsFormedOnlyWhenFirstUsed) {
  auto store = make_memory_store();
  testing::run_ranks(4, [&](int rank) {
    GroupOptions o;
    o.timeout = milliseconds(10000);
    o.host = "host" + std::to_string(rank / 2);
    auto h = HierarchicalGroup::create(store, rank, 4, o);
    EXPECT_EQ(h->rank(), rank);
    EXPECT_EQ(h->size(), 4);
    EXPECT_EQ(h->hosts(), (std::vector<std::string>{"host0", "host0", "host1", "host1"}));
    int64_t x = rank;
    h->allreduce(&x, 1, DataType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(x, 6);
    EXPECT_FALSE(store->check({"global/rank/" + std::to_string(rank)})) << "the mesh formed with the hierarchy";
    int64_t y = rank == 3 ? 42 : 0;
    h->global().broadcast(&y, sizeof y, 3);
    EXPECT_EQ(y, 42);
    EXPECT_TRUE(store->check({"global/rank/" + std::to_string(rank)}));
    h->abort("a peer was lost");
    try {
      h->global();
      ADD_FAILURE() << "an aborted group's global group was handed out";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("a peer was lost"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dsgd::comm
