// Memory known before it runs out (runtime/driver/memory_check.h): a job whose workers would
// not fit stops naming both figures and what would fit; one that fits says what it will hold.
#include "runtime/driver/memory_check.h"

#include <gtest/gtest.h>

#include <string>

#include "dsgd/common/error.h"

namespace dsgd::runtime {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// gpt-large with AdamW on one worker of two: 3 GiB of weights (1.5 at stage 3), the gradients'
// 3 GiB (4.5 at stage 1, 1.5 plus a ring at stages 2 and 3), Adam's 6 GiB (3 under zero).
WorkerMemory large_worker() {
  return {MemoryParts{3 * kGiB, 3 * kGiB, 6 * kGiB}, MemoryParts{3 * kGiB, 4 * kGiB + kGiB / 2, 3 * kGiB},
          MemoryParts{3 * kGiB, 2 * kGiB, 3 * kGiB}, MemoryParts{kGiB + kGiB / 2, 2 * kGiB, 3 * kGiB}};
}

std::string error_of(const std::vector<WorkerMemory>& workers, int stage, int64_t available) {
  try {
    check_memory(workers, stage, available);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "launch.memory_mib");
    return e.what();
  }
  return "";
}

TEST(MemoryCheck, AJobThatWouldNotFitNamesBothFiguresAndTheStageThatWould) {
  const std::vector<WorkerMemory> two{large_worker(), large_worker()};
  // 24 GiB at stage 0 against 20 available: stage 1 needs 21, stage 2 16.
  const std::string e = error_of(two, 0, 20 * kGiB);
  EXPECT_NE(e.find("24.00 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("20.00 GiB available"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer state 6.00 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("--zero 2 (16.00 GiB)"), std::string::npos) << e;
  EXPECT_NE(e.find("about 1 worker(s)"), std::string::npos) << e;
  // Stage 3 (13 GiB) where stage 2 does not fit; nothing but fewer workers; then nothing at all.
  EXPECT_NE(error_of(two, 2, 15 * kGiB).find("--zero 3 (13.00 GiB), or about 1 worker(s)"), std::string::npos);
  EXPECT_NE(error_of(two, 3, 12 * kGiB).find("about 1 worker(s)"), std::string::npos);
  EXPECT_NE(error_of(two, 2, 4 * kGiB).find("a smaller model"), std::string::npos);
}

// The start-up snapshot: worker 0's state as bytes and the driver's copy (2 x the 3 GiB of
// weights), worker 0's weights gathered whole first at stage 3 (1.5 more), and where the replicas
// set up unequal each worker's received copy and its load (2 x 3 GiB each).
TEST(MemoryCheck, TheStartUpSnapshotCountsAndCanTipAJobOver) {
  const std::vector<WorkerMemory> two{large_worker(), large_worker()};
  const StageBytes equal = start_copies(two, /*sent=*/false), sent = start_copies(two, /*sent=*/true);
  EXPECT_EQ(equal[0], 6 * kGiB);
  EXPECT_EQ(equal[2], 6 * kGiB);
  EXPECT_EQ(equal[3], 7 * kGiB + kGiB / 2);
  EXPECT_EQ(sent[0], 18 * kGiB);
  // Stage 2 holds 16 GiB: it fits in 20 without the snapshot, not with it; stage 3 (13 + 7.5) does not
  // either, so only fewer workers would.
  EXPECT_EQ(error_of(two, 2, 20 * kGiB), "");
  std::string e;
  try {
    check_memory(two, 2, 20 * kGiB, equal);
  } catch (const ConfigError& error) {
    e = error.what();
  }
  EXPECT_NE(e.find("and 6.00 GiB more while the start-up snapshot is taken"), std::string::npos) << e;
  EXPECT_EQ(e.find("--zero 3"), std::string::npos) << e;
  EXPECT_NE(e.find("about 1 worker(s)"), std::string::npos) << e;
  EXPECT_NE(check_memory(two, 3, 21 * kGiB, equal).find("13.00 GiB before activations"), std::string::npos);
}

TEST(MemoryCheck, AJobThatFitsOrAMachineThatDoesNotSaySaysWhatItWillHold) {
  const std::vector<WorkerMemory> two{large_worker(), large_worker()};
  EXPECT_EQ(error_of(two, 2, 16 * kGiB), "");
  EXPECT_NE(check_memory(two, 2, 16 * kGiB).find("2 worker(s) on this machine will hold 16.00 GiB"), std::string::npos);
  EXPECT_EQ(error_of(two, 0, -1), "");  // unknown: nothing checked
  EXPECT_EQ(check_memory({}, 0, 0), "");
  EXPECT_GT(available_memory_bytes(), 0);  // this machine's /proc/meminfo says
}

}  // namespace
}  // namespace dsgd::runtime
