// The shared-memory group: results against closed forms (threads as ranks; the segment is
// mapped once per rank as it would be per process), then failures with forked processes, and
// /dev/shm left clean in every case.
#include "dsgd/comm/shm_group.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "testing/allreduce_check.h"
#include "dsgd/common/error.h"
#include "testing/ranks.h"
#include "testing/temp_dir.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Segments in /dev/shm created by these processes (names are "dsgd-<creator pid>-<random>").
// Only our own: ctest runs other tests, with their own live segments, alongside this one.
int dsgd_segments_in_dev_shm(const std::vector<pid_t>& creators = {::getpid()}) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    for (pid_t pid : creators) {
      if (name.rfind("dsgd-" + std::to_string(pid) + "-", 0) == 0) ++n;
    }
  }
  return n;
}

ShmOptions small_slots() {
  ShmOptions o;
  o.slot_bytes = 64 << 10;  // small, so larger buffers exercise the pieces
  o.timeout = milliseconds(5000);
  return o;
}

// Where the data lies: memory of the rank's own, its slot (buffer()), or its shared region at an
// offset (shared_buffer()).
enum class Place { kHeap, kSlot, kShared };
constexpr size_t kSharedOffset = 192;

ShmOptions small_slots_and_shared() {
  ShmOptions o = small_slots();
  o.shared_bytes = 100003 * sizeof(double) + kSharedOffset;
  return o;
}

template <typename T>
void check_allreduce(ShmGroup& g, DataType type, Place place) {
  const int n = g.size();
  const bool zero_copy = place != Place::kHeap;
  for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{13}, size_t{1000}, size_t{65537}, size_t{100003}}) {
      if (place == Place::kSlot && count * sizeof(T) > g.buffer_bytes()) continue;
      std::vector<T> heap(count);
      T* v = place == Place::kSlot     ? static_cast<T*>(g.buffer())
             : place == Place::kShared ? reinterpret_cast<T*>(static_cast<char*>(g.shared_buffer()) + kSharedOffset)
                                       : heap.data();
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>((g.rank() + 1) * static_cast<int>(i % 7 + 1));
      g.allreduce(v, count, type, op);
      for (size_t i = 0; i < count; ++i) {
        const T base = static_cast<T>(i % 7 + 1);
        const T sum = base * static_cast<T>(n * (n + 1) / 2);
        const T expected = op == ReduceOp::kSum   ? sum
                           : op == ReduceOp::kMax ? base * static_cast<T>(n)
                                                  : sum / static_cast<T>(n);
        ASSERT_EQ(v[i], expected) << "rank " << g.rank() << "/" << n << " " << to_string(type) << " " << to_string(op)
                                  << " count " << count << (zero_copy ? " zero-copy" : "") << " element " << i;
      }
    }
  }
}


class ShmSizes : public ::testing::TestWithParam<int> {};

TEST_P(ShmSizes, AllreduceSixteenBitTypesInFloat32) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), small_slots());
    for (auto type : {DataType::kFloat16, DataType::kBFloat16}) {
      check_allreduce_16(rank, GetParam(), type, [&](uint16_t* data, size_t count, ReduceOp op) {
        g->allreduce(data, count, type, op);
      });
    }
  });
}


TEST_P(ShmSizes, AllreduceEveryDtypeOpAndSizeCopyingAndZeroCopy) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), small_slots_and_shared());
    for (Place place : {Place::kHeap, Place::kSlot, Place::kShared}) {
      check_allreduce<float>(*g, DataType::kFloat32, place);
      check_allreduce<double>(*g, DataType::kFloat64, place);
      check_allreduce<int64_t>(*g, DataType::kInt64, place);
    }
  });
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

// Rank q's block b, element i: (q + 1) * (b + 1) * (i % 5 + 1). Rank r's reduce-scatter gets
// block r summed over the ranks; its allgather, every rank's bytes in rank order.
// `shared`: the input in the shared regions (zero-copy).
template <typename T>
void check_reduce_scatter(ShmGroup& g, DataType type, bool in_place, bool shared = false) {
  const size_t n = static_cast<size_t>(g.size()), r = static_cast<size_t>(g.rank());
  for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{13}, size_t{1000}, size_t{65537}}) {
      std::vector<T> heap(shared ? 0 : n * count), out(count, T{0});
      T* in = shared ? reinterpret_cast<T*>(static_cast<char*>(g.shared_buffer()) + kSharedOffset) : heap.data();
      for (size_t b = 0; b < n; ++b) {
        for (size_t i = 0; i < count; ++i) in[b * count + i] = static_cast<T>((r + 1) * (b + 1) * (i % 5 + 1));
      }
      T* dst = in_place ? in + r * count : out.data();
      g.reduce_scatter_async(in, dst, count, type, op)->wait();
      for (size_t i = 0; i < count; ++i) {
        const T base = static_cast<T>((r + 1) * (i % 5 + 1));
        const T sum = base * static_cast<T>(n * (n + 1) / 2);
        const T expected = op == ReduceOp::kSum   ? sum
                           : op == ReduceOp::kMax ? base * static_cast<T>(n)
                                                  : sum / static_cast<T>(n);
        ASSERT_EQ(dst[i], expected) << "rank " << r << "/" << n << " " << to_string(type) << " " << to_string(op)
                                    << " count " << count << (in_place ? " in place" : "")
                                    << (shared ? " zero-copy" : "") << " element " << i;
      }
    }
  }
}

TEST_P(ShmSizes, ReduceScatterEveryDtypeOpAndSizeAcrossPieces) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), small_slots());
    for (bool in_place : {false, true}) {
      check_reduce_scatter<float>(*g, DataType::kFloat32, in_place);
      check_reduce_scatter<double>(*g, DataType::kFloat64, in_place);
      check_reduce_scatter<int64_t>(*g, DataType::kInt64, in_place);
    }
  });
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

// Shared regions large enough for every rank's blocks of the largest case above.
ShmOptions shared_for(int ranks) {
  ShmOptions o = small_slots();
  o.shared_bytes = static_cast<size_t>(ranks) * 65537 * sizeof(double) + kSharedOffset;
  return o;
}

// The input in the shared regions: each rank reduces its block where the blocks lie (ZeRO's
// gradient buckets are there), into memory of its own or in place.
TEST_P(ShmSizes, ReduceScatterZeroCopyFromTheSharedRegions) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), shared_for(GetParam()));
    for (bool in_place : {false, true}) {
      check_reduce_scatter<float>(*g, DataType::kFloat32, in_place, /*shared=*/true);
      check_reduce_scatter<double>(*g, DataType::kFloat64, in_place, true);
    }
  });
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

// The output in the shared regions: each rank writes its block in its place and copies the
// others' from their regions; from memory of its own or from its block (in place).
TEST_P(ShmSizes, AllgatherZeroCopyIntoTheSharedRegions) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), shared_for(GetParam()));
    const size_t n = static_cast<size_t>(g->size());
    auto* out = static_cast<uint8_t*>(g->shared_buffer()) + kSharedOffset;
    for (bool in_place : {false, true}) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{200003}}) {
        std::vector<uint8_t> mine(bytes);
        for (size_t j = 0; j < bytes; ++j) mine[j] = static_cast<uint8_t>(j * 7 + static_cast<size_t>(rank) * 31);
        std::fill(out, out + n * bytes, 0xee);
        const uint8_t* in = mine.data();
        if (in_place) {
          std::copy(mine.begin(), mine.end(), out + rank * bytes);
          in = out + rank * bytes;
        }
        g->allgather_async(in, out, bytes)->wait();
        for (size_t q = 0; q < n; ++q) {
          for (size_t j = 0; j < bytes; ++j) {
            ASSERT_EQ(out[q * bytes + j], static_cast<uint8_t>(j * 7 + q * 31))
                << "rank " << rank << " block " << q << " byte " << j << " of " << bytes << " zero-copy";
          }
        }
        g->barrier();  // nobody reads this rank's region before it is refilled
      }
    }
  });
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

TEST_P(ShmSizes, AllgatherEveryRanksBytesInRankOrderAcrossPieces) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), small_slots());
    const size_t n = static_cast<size_t>(g->size());
    for (bool in_place : {false, true}) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{200003}}) {
        std::vector<uint8_t> mine(bytes), out(n * bytes, 0xee);
        for (size_t j = 0; j < bytes; ++j) mine[j] = static_cast<uint8_t>(j * 7 + static_cast<size_t>(rank) * 31);
        const uint8_t* in = mine.data();
        if (in_place) {
          std::copy(mine.begin(), mine.end(), out.begin() + static_cast<ptrdiff_t>(rank * bytes));
          in = out.data() + rank * bytes;
        }
        g->allgather_async(in, out.data(), bytes)->wait();
        for (size_t q = 0; q < n; ++q) {
          for (size_t j = 0; j < bytes; ++j) {
            ASSERT_EQ(out[q * bytes + j], static_cast<uint8_t>(j * 7 + q * 31))
                << "rank " << rank << " block " << q << " byte " << j << " of " << bytes;
          }
        }
      }
    }
  });
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

TEST_P(ShmSizes, BroadcastFromEveryRootAcrossPieces) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), small_slots());
    for (int root = 0; root < g->size(); ++root) {
      std::vector<uint8_t> v(200003, 0xee);
      if (rank == root) {
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 13 + root);
      }
      g->broadcast(v.data(), v.size(), root);
      for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<uint8_t>(i * 13 + root)) << i;
    }
  });
}

// Data living in the shared regions stays as it was through operations that use the slots.
TEST_P(ShmSizes, SharedRegionsKeepTheirDataThroughOtherOperations) {
  auto store = make_memory_store();
  testing::run_ranks(GetParam(), [&](int rank) {
    auto g = ShmGroup::create(store, rank, GetParam(), small_slots_and_shared());
    auto* kept = static_cast<float*>(g->shared_buffer());
    const size_t n = g->shared_buffer_bytes() / sizeof(float);
    for (size_t i = 0; i < n; ++i) kept[i] = static_cast<float>(rank * 1000 + i % 997);
    std::vector<float> other(100003, 1.0f);
    g->allreduce(other.data(), other.size(), DataType::kFloat32, ReduceOp::kSum);
    std::vector<uint8_t> bytes(200003, static_cast<uint8_t>(rank));
    g->broadcast(bytes.data(), bytes.size(), 0);
    g->barrier();
    EXPECT_EQ(other[100002], static_cast<float>(g->size()));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(kept[i], static_cast<float>(rank * 1000 + i % 997)) << i;
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmSizes, ::testing::Values(1, 2, 3, 4));

// Ranks that pass different places for one allreduce would sum unrelated memory: the group
// fails on every rank, naming the mismatch, and their data is left as it was.
TEST(Shm, RanksAllreducingDifferentRegionsFailTheGroupInsteadOfMixingThem) {
  for (const bool one_staged : {false, true}) {
    auto store = make_memory_store();
    testing::run_ranks(2, [&](int rank) {
      auto g = ShmGroup::create(store, rank, 2, small_slots_and_shared());
      std::vector<float> heap(100, 5.0f);
      float* v = reinterpret_cast<float*>(static_cast<char*>(g->shared_buffer()) + 64 * rank);
      if (one_staged && rank == 1) v = heap.data();
      std::fill_n(v, 100, 5.0f);
      try {
        g->allreduce(v, 100, DataType::kFloat32, ReduceOp::kSum);
        ADD_FAILURE() << "rank " << rank << ": the allreduce succeeded";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("same region of its shared buffer"), std::string::npos) << e.what();
      }
      for (int i = 0; i < 100; ++i) ASSERT_EQ(v[i], 5.0f) << "rank " << rank << " element " << i;
    });
  }
}

// Every rank of a host must make its segment alike: one asking for a shared region of another
// size is told so.
TEST(Shm, RanksWithDifferentSharedSizesGetAConfigError) {
  auto store = make_memory_store();
  std::atomic<int> config_errors{0};
  testing::run_ranks(2, [&](int rank) {
    ShmOptions o = small_slots();
    o.timeout = milliseconds(1000);
    o.shared_bytes = rank == 0 ? 4096 : 8192;
    try {
      ShmGroup::create(store, rank, 2, o);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("every rank of a host must pass the same ShmOptions"), std::string::npos)
          << e.what();
      ++config_errors;
    } catch (const Error&) {  // rank 0 waits for a rank that gave up: its rendezvous times out
    }
  });
  EXPECT_EQ(config_errors.load(), 1);
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

TEST(Shm, AbortFromAnotherThreadUnblocksABarrier) {
  auto store = make_memory_store();
  std::atomic<bool> done{false};
  testing::run_ranks(2, [&](int rank) {
    auto g = ShmGroup::create(store, rank, 2, small_slots());
    if (rank == 1) {  // never enters the barrier
      while (!done) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(100));
      g->abort("test abort");
    });
    const auto t0 = Clock::now();
    try {
      g->barrier(milliseconds(20000));
      ADD_FAILURE() << "barrier passed without rank 1";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - t0, milliseconds(2000));
    aborter.join();
    EXPECT_THROW(g->barrier(), CommError);  // sticky
    done = true;
  });
}

TEST(Shm, MissingRankTimesOutAndLeavesNothingInDevShm) {
  auto store = make_memory_store();
  ShmOptions o = small_slots();
  o.timeout = milliseconds(300);
  EXPECT_THROW(ShmGroup::create(store, 0, 2, o), TimeoutError);
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);
}

// Forks `size` ranks that allreduce 8 MiB in a loop; signals `victim`; returns survivors' reports
// "<ms after the signal>|<kind>|<message>". The ranks' pids go to `pids`.
std::vector<std::string> run_failure(int size, int victim, int sig, milliseconds timeout, std::vector<pid_t>& pids) {
  testing::TempDir dir;
  const std::string store_dir = dir.file("store");
  for (int r = 0; r < size; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      auto store = make_file_store(store_dir);
      try {
        ShmOptions o;
        o.slot_bytes = 1 << 20;
        o.timeout = timeout;
        auto g = ShmGroup::create(store, r, size, o);
        std::vector<float> v(2 << 20, 1.0f);
        store->set("ready/" + std::to_string(r), "1");
        try {
          while (true) g->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
        } catch (const CommError& e) {
          const int64_t now = std::chrono::duration_cast<milliseconds>(Clock::now().time_since_epoch()).count();
          const int64_t at = std::stoll(store->get("signalled_at", milliseconds(10000)));
          store->set("result/" + std::to_string(r), std::to_string(now - at) + "|" +
                                                        (dynamic_cast<const TimeoutError*>(&e) ? "timeout" : "comm") +
                                                        "|" + e.what());
        }
        store->get("exit", milliseconds(60000));
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  auto store = make_file_store(store_dir);
  for (int r = 0; r < size; ++r) store->wait({"ready/" + std::to_string(r)}, milliseconds(20000));
  std::this_thread::sleep_for(milliseconds(200));
  store->set("signalled_at",
             std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now().time_since_epoch()).count()));
  ::kill(pids[victim], sig);
  std::vector<std::string> results;
  for (int r = 0; r < size; ++r) {
    if (r != victim) results.push_back(store->get("result/" + std::to_string(r), timeout * 3 + milliseconds(10000)));
  }
  store->set("exit", "1");
  for (pid_t pid : pids) ::kill(pid, SIGKILL);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  return results;
}

TEST(ShmFailure, KilledRankFailsSurvivorsFastByNameAndNothingLeaks) {
  std::vector<pid_t> pids;
  auto results = run_failure(3, 1, SIGKILL, milliseconds(10000), pids);
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_LT(std::stoll(r.substr(0, r.find('|'))), 2000) << r;
    EXPECT_NE(r.find("|comm|"), std::string::npos) << r;
    EXPECT_NE(r.find("rank 1 (pid "), std::string::npos) << r;
  }
  EXPECT_EQ(dsgd_segments_in_dev_shm(pids), 0);
}

TEST(ShmFailure, StoppedRankTimesOutSurvivorsNamingIt) {
  std::vector<pid_t> pids;
  auto results = run_failure(2, 0, SIGSTOP, milliseconds(1000), pids);
  ASSERT_EQ(results.size(), 1u);
  const auto& r = results[0];
  const int64_t ms = std::stoll(r.substr(0, r.find('|')));
  EXPECT_GE(ms, 800) << r;
  EXPECT_LT(ms, 2000) << r;
  EXPECT_NE(r.find("|timeout|"), std::string::npos) << r;
  EXPECT_NE(r.find("rank(s) 0 did not arrive"), std::string::npos) << r;
  EXPECT_EQ(dsgd_segments_in_dev_shm(pids), 0);
}

}  // namespace
}  // namespace dsgd::comm

namespace dsgd::comm {
namespace {

TEST(Shm, ManyQueuedAsyncOperationsCompleteInOrder) {
  auto store = make_memory_store();
  testing::run_ranks(3, [&](int rank) {
    auto g = ShmGroup::create(store, rank, 3, small_slots());
    constexpr int kOps = 40;
    std::vector<std::vector<float>> bufs(kOps);
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      bufs[k].assign(static_cast<size_t>(50 + k * 997), static_cast<float>(k + rank));
      works.push_back(g->allreduce_async(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kSum));
    }
    works.push_back(g->barrier_async());
    for (int k = kOps; k >= 0; --k) works[k]->wait(std::chrono::milliseconds(10000));
    for (int k = 0; k < kOps; ++k) {
      EXPECT_EQ(bufs[k].front(), static_cast<float>(3 * k + 3)) << k;
      EXPECT_EQ(bufs[k].back(), static_cast<float>(3 * k + 3)) << k;
    }
  });
}

}  // namespace
}  // namespace dsgd::comm

namespace dsgd::comm {
namespace {

bool in_dev_shm(const std::string& name) { return std::filesystem::exists("/dev/shm/" + name); }

std::string make_segment(const std::string& name) {
  const int fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_RDWR, 0600);
  EXPECT_GE(fd, 0) << name << ": " << std::strerror(errno);
  if (fd >= 0) ::close(fd);
  return name;
}

// A process that has exited: its pid names no one (until the kernel hands it out again, which
// takes a full turn of the pid space).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

std::string our_pid_namespace() {
  struct stat st {};
  EXPECT_EQ(::stat("/proc/self/ns/pid", &st), 0);
  return std::to_string(st.st_ino);
}

TEST(ShmOrphans, OnlySegmentsOfDeadCreatorsInThisPidNamespaceAreRemoved) {
  const std::string dead = std::to_string(dead_pid()), alive = std::to_string(::getpid()), ns = our_pid_namespace();
  const std::string orphan = make_segment("dsgd-" + dead + "-11-" + ns);
  const std::string legacy = make_segment("dsgd-" + dead + "-12");  // a name from before the namespace
  const std::string live = make_segment("dsgd-" + alive + "-13-" + ns);
  const std::string elsewhere = make_segment("dsgd-" + dead + "-14-" + ns + "7");  // another namespace's pid
  const std::string stranger = make_segment("dsgd-" + dead + "-x-" + ns);          // not a name of ours
  EXPECT_GE(remove_orphaned_segments(), 0);
  EXPECT_FALSE(in_dev_shm(orphan));
  EXPECT_FALSE(in_dev_shm(legacy));
  EXPECT_TRUE(in_dev_shm(live));
  EXPECT_TRUE(in_dev_shm(elsewhere));
  EXPECT_TRUE(in_dev_shm(stranger));
  for (const auto& n : {live, elsewhere, stranger}) ::shm_unlink(("/" + n).c_str());
}

// The path that leaked: a creator killed after making its segment, before the other ranks mapped
// it (here: they never come). Its name stays until the next group on the host is created.
TEST(ShmOrphans, ACreatorKilledBeforeItsGroupFormedLeavesANameTheNextGroupRemoves) {
  testing::TempDir dir;
  const std::string store_dir = dir.file("store");
  const pid_t creator = ::fork();
  if (creator == 0) {
    try {
      ShmOptions o = small_slots();
      o.timeout = milliseconds(60000);
      (void)ShmGroup::create(make_file_store(store_dir), 0, 2, o);  // waits for rank 1, which never comes
    } catch (...) {
    }
    ::_exit(0);
  }
  auto store = make_file_store(store_dir);
  const std::string name = store->get("shm/name", milliseconds(20000)).substr(1);
  ASSERT_TRUE(in_dev_shm(name)) << name;
  ::kill(creator, SIGKILL);
  ::waitpid(creator, nullptr, 0);
  EXPECT_TRUE(in_dev_shm(name)) << "nobody was left to remove it";
  auto g = ShmGroup::create(make_memory_store(), 0, 1, small_slots());
  EXPECT_FALSE(in_dev_shm(name)) << name;
  EXPECT_EQ(dsgd_segments_in_dev_shm(), 0);  // and the new group's own name is gone once formed
}

}  // namespace
}  // namespace dsgd::comm
