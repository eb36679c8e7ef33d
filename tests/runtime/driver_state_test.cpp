// The driver's state on disk (runtime/driver/driver_state.h): what a driver started again in its
// place reads back, and what it refuses to take up.
#include "runtime/driver/driver_state.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dsgd/common/error.h"
#include "testing/temp_dir.h"

namespace {

using dsgd::runtime::DriverState;
using dsgd::runtime::DriverStateFile;

DriverState some_state() {
  DriverState s;
  s.job = "0123456789abcdef";
  s.driver_pid = 999999999;  // no such process
  s.address = "127.0.0.1:4242";
  s.token = "t0ken";
  s.generation = 7;
  s.restarts = 1;
  s.next_spawn_index = 5;
  s.signature = "fc.weight [10, 4] float\n";
  s.parameters = 50;
  s.workers = {{3, 2, 1234, true, "vm", "127.0.0.1", 0, true}, {4, 4, 1240, true, "vm", "127.0.0.1", 1, false}};
  s.checkpoint = "/ckpts/step-000000000040";
  s.checkpoint_steps = 40;
  s.batches_per_epoch = 64;
  return s;
}

TEST(DriverStateFile, ReadsBackWhatWasWrittenOwnerOnly) {
  dsgd::testing::TempDir dir;
  DriverStateFile file(dir.file("state"));
  EXPECT_FALSE(file.resumable("0123456789abcdef")) << "no state yet";
  file.write(some_state());
  struct stat st {};
  ASSERT_EQ(::stat(file.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "it holds the job's token";
  const auto s = file.resumable("0123456789abcdef");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->address, "127.0.0.1:4242");
  EXPECT_EQ(s->token, "t0ken");
  EXPECT_EQ(s->generation, 7);
  ASSERT_EQ(s->workers.size(), 2u);
  EXPECT_EQ(s->workers[1].id, 4);
  EXPECT_EQ(s->workers[1].pid, 1240);
  EXPECT_EQ(s->workers[1].pseudo_host, 1);
  EXPECT_FALSE(s->workers[1].member);
  EXPECT_EQ(s->checkpoint, "/ckpts/step-000000000040");
  EXPECT_EQ(s->checkpoint_steps, 40);
  EXPECT_EQ(s->batches_per_epoch, 64);
  const auto age = std::chrono::system_clock::now() - s->last_alive;
  EXPECT_LT(std::chrono::abs(age), std::chrono::seconds(5)) << "last alive: when the file was written";
  EXPECT_FALSE(std::filesystem::exists(file.path() + ".tmp." + std::to_string(::getpid())));
}

TEST(DriverStateFile, AnEndedJobIsNotTakenUpAnotherJobsAndALiveDriversAreRefused) {
  dsgd::testing::TempDir dir;
  DriverStateFile file(dir.file("state"));
  file.write(some_state());
  try {
    file.resumable("fedcba9876543210");
    FAIL() << "another job's state was taken up";
  } catch (const dsgd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds the state of another job"), std::string::npos) << e.what();
    EXPECT_EQ(e.field(), "recovery.driver_state_dir");
  }
  // A driver of this binary that still runs owns it (a forked child of this test runs this binary).
  const pid_t live = ::fork();
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  DriverState s = some_state();
  s.driver_pid = live;
  file.write(s);
  try {
    file.resumable(s.job);
    ADD_FAILURE() << "a running driver's state was taken up";
  } catch (const dsgd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("still runs (pid " + std::to_string(live) + ")"), std::string::npos)
        << e.what();
  }
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
  EXPECT_TRUE(file.resumable(s.job)) << "its driver is gone: the job is there to take up";
  file.write_ended();
  EXPECT_FALSE(file.resumable(s.job)) << "an ended job is not taken up";
}

TEST(DriverStateFile, AFileThatIsNotADriversStateSaysWhatToDo) {
  dsgd::testing::TempDir dir;
  std::filesystem::create_directories(dir.file("state"));
  { std::ofstream(dir.file("state") + "/driver.json") << "{\"format\": 1, \"job\": "; }
  DriverStateFile file(dir.file("state"));
  try {
    file.resumable("x");
    FAIL();
  } catch (const dsgd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("remove it to start a new job there"), std::string::npos) << e.what();
  }
}

}  // namespace
