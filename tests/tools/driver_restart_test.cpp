// A driver that restarts in place (`dsgd train --driver-state DIR`), tried as a user would: the
// driver killed with SIGKILL mid-epoch, the same command started again. The job must finish with
// the workers it had (their processes unchanged: the new driver starts none), end where a
// fault-free run ends, and say in its summary that the driver restarted and what it cost.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_dsgd.h"
#include "testing/temp_dir.h"

namespace {

using dsgd::testing::children_of;
using dsgd::testing::process_gone;
using dsgd::testing::start_train;
using Clock = std::chrono::steady_clock;

// `epochs` of 64 steps of the MLP on synthetic data, 2 workers: seconds an epoch on this
// machine, a snapshot every 10 steps.
std::vector<std::string> job(const dsgd::testing::TempDir& dir, const std::string& name, int epochs = 2) {
  return {"--workers", "2", "--model", "mlp", "--dataset", "synthetic", "--synthetic-samples", "4096",
          "--batch-size", "64", "--epochs", std::to_string(epochs), "--threads", "1", "--checkpoint-every", "10",
          "--checkpoint-overhead", "0", "--heartbeat-timeout-ms", "3000", "--save", dir.file(name + "-model"),
          "--json-out", dir.file(name + ".json")};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

using dsgd::testing::read_file;

nlohmann::json summary(const std::string& path) {
  std::ifstream f(path);
  return f.good() ? nlohmann::json::parse(f) : nlohmann::json();
}

// The newest step a driver's snapshots reached on disk (-1: none yet).
int64_t newest_step(const std::string& root) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename();
    if (name.rfind("step-", 0) == 0) newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
  }
  return newest;
}

// Starts the job with --driver-state, and kills its driver (SIGKILL) once a snapshot after step
// 30 is on disk: mid-epoch 1 of 2. Returns the workers' pids, alive after the kill.
std::vector<pid_t> start_then_kill_the_driver(const std::vector<std::string>& args, const std::string& state,
                                              const std::string& log) {
  const pid_t driver = start_train(args, log);
  const auto workers = children_of(driver, 2);
  EXPECT_EQ(workers.size(), 2u) << "the driver did not start its workers\n" << read_file(log);
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (newest_step(state + "/checkpoints") < 30 && Clock::now() < deadline && !process_gone(driver)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(process_gone(driver)) << "the job ended before the kill\n" << read_file(log);
  EXPECT_GE(newest_step(state + "/checkpoints"), 30) << read_file(log);
  ::kill(driver, SIGKILL);
  ::waitpid(driver, nullptr, 0);
  return workers;
}

TEST(DriverRestart, AKilledDriverStartedAgainGoesOnWithItsWorkersAndEndsAsTheFaultFreeRun) {
  dsgd::testing::TempDir dir;
  const std::string state = dir.file("state"), log = dir.file("driver.log");
  const pid_t clean = start_train(job(dir, "clean"));
  ASSERT_EQ(wait_exit(clean), 0) << "the fault-free run failed";

  const auto args = with(job(dir, "restarted"), {"--driver-state", state});
  const auto workers = start_then_kill_the_driver(args, state, log);
  ASSERT_EQ(workers.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (pid_t w : workers) EXPECT_FALSE(process_gone(w)) << "worker " << w << " died with its driver";

  const pid_t again = start_train(args, log);
  // The new driver starts no worker: the old ones go on (a replacement would be its child).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_TRUE(dsgd::testing::worker_children(again).empty()) << read_file(log);
  for (pid_t w : workers) EXPECT_FALSE(process_gone(w)) << "worker " << w << " is gone\n" << read_file(log);
  ASSERT_EQ(wait_exit(again), 0) << read_file(log);
  const auto t0 = Clock::now();
  for (pid_t w : workers) {
    while (!process_gone(w) && Clock::now() - t0 < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(process_gone(w)) << "worker " << w << " outlived the job";
  }

  const auto j = summary(dir.file("restarted.json")), c = summary(dir.file("clean.json"));
  ASSERT_TRUE(j.is_object()) << read_file(log);
  ASSERT_TRUE(c.is_object());
  // Where the fault-free run ends: the same parameters (model.pt's bytes), the same evaluation.
  EXPECT_EQ(j["steps"], c["steps"]);
  EXPECT_EQ(j["test_loss"].get<double>(), c["test_loss"].get<double>());
  EXPECT_EQ(read_file(dir.file("restarted-model") + "/model.pt"), read_file(dir.file("clean-model") + "/model.pt"));
  // The summary says the driver restarted and kept both workers, which stood together at a
  // step's end (the chunk the old driver had sent them, finished): they went on from there, and
  // nothing was trained again.
  ASSERT_EQ(j["recoveries"].size(), 1u) << j.dump(2);
  const auto& r = j["recoveries"][0];
  EXPECT_EQ(r["kind"], "driver_restart") << r.dump();
  EXPECT_EQ(r["lost"], "") << r.dump();
  EXPECT_EQ(r["workers_after"], 2);
  EXPECT_GE(r["at_step"].get<int64_t>(), 30);
  EXPECT_EQ(r["rolled_back_steps"], 0) << r.dump();
  EXPECT_TRUE(r["from_peer"].get<bool>()) << r.dump();
  EXPECT_GT(r["recovery_s"].get<double>(), r["detect_s"].get<double>());
  EXPECT_LT(r["recovery_s"].get<double>() - r["detect_s"].get<double>(), 60.0) << r.dump();
  std::ifstream driver_json(state + "/driver.json");
  EXPECT_TRUE(nlohmann::json::parse(driver_json)["ended"].get<bool>()) << "the job's end is recorded";
}

// A job that --load-ed a sharded checkpoint (a save's) and lost its driver before writing one of
// its own: the new driver goes on from the sharded one, read whole into it, not from the start-up
// snapshot of the state before the load (or not at all).
TEST(DriverRestart, AfterLoadingASaveTheNewDriverGoesOnFromIt) {
  dsgd::testing::TempDir dir;
  const std::string state = dir.file("state"), log = dir.file("driver.log"), saved = dir.file("first-model");
  const pid_t first = start_train(job(dir, "first", 1));
  ASSERT_EQ(wait_exit(first), 0);
  ASSERT_TRUE(std::filesystem::exists(saved + "/manifest.json"));
  auto args = job(dir, "loaded", 3);  // no snapshot of its own to disk before the kill
  args.at(static_cast<size_t>(std::find(args.begin(), args.end(), "--checkpoint-every") - args.begin()) + 1) = "100000";
  args = with(args, {"--load", saved, "--driver-state", state});
  const pid_t driver = start_train(args, log);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (read_file(state + "/driver.json").find("\"" + saved + "\"") == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(driver, SIGKILL);
  ::waitpid(driver, nullptr, 0);
  ASSERT_NE(read_file(state + "/driver.json").find("\"" + saved + "\""), std::string::npos) << read_file(log);
  const pid_t again = start_train(args, log);
  ASSERT_EQ(wait_exit(again), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("taking up the job of driver pid " + std::to_string(driver)), std::string::npos);
  EXPECT_NE(read_file(log).find("from " + saved + " (epoch 1, batch 0"), std::string::npos) << read_file(log);
  const auto j = summary(dir.file("loaded.json"));
  ASSERT_TRUE(j.is_object()) << read_file(log);
  EXPECT_EQ(j["recoveries"][0]["kind"], "driver_restart") << j.dump(2);
}

TEST(DriverRestart, WorkersThatDidNotWaitAreStartedAgainAndTheJobStillEndsAsTheFaultFreeRun) {
  dsgd::testing::TempDir dir;
  const std::string state = dir.file("state"), log = dir.file("driver.log");
  const pid_t clean = start_train(job(dir, "clean"));
  ASSERT_EQ(wait_exit(clean), 0) << "the fault-free run failed";

  const auto args = with(job(dir, "restarted"), {"--driver-state", state, "--driver-grace-ms", "1000"});
  const auto workers = start_then_kill_the_driver(args, state, log);
  ASSERT_EQ(workers.size(), 2u);
  const auto t0 = Clock::now();  // they wait the grace (1 s) beyond the heartbeat timeout (3 s), then exit
  for (pid_t w : workers) {
    while (!process_gone(w) && Clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(process_gone(w)) << "worker " << w << " waited beyond its grace\n" << read_file(log);
  }
  const pid_t again = start_train(args, log);
  ASSERT_EQ(wait_exit(again), 0) << read_file(log);
  const auto j = summary(dir.file("restarted.json")), c = summary(dir.file("clean.json"));
  ASSERT_TRUE(j.is_object()) << read_file(log);
  EXPECT_EQ(j["test_loss"].get<double>(), c["test_loss"].get<double>());
  EXPECT_EQ(read_file(dir.file("restarted-model") + "/model.pt"), read_file(dir.file("clean-model") + "/model.pt"));
  ASSERT_GE(j["recoveries"].size(), 1u) << j.dump(2);
  const auto& r = j["recoveries"].back();
  EXPECT_EQ(r["kind"], "driver_restart") << r.dump();
  EXPECT_NE(r["lost"].get<std::string>().find("pid " + std::to_string(workers[0])), std::string::npos) << r.dump();
}

TEST(DriverRestart, WorkersStartedByAnotherLauncherWaitForTheirDriverToo) {
  // Remote mode: `dsgd worker` processes the driver did not start (a Slurm allocation's, say)
  // outlive it the same way, and the driver started again finds them. With --no-from-peer it
  // restores the checkpoint into them rather than going on from where they stand.
  dsgd::testing::TempDir dir;
  const std::string state = dir.file("state"), log = dir.file("driver.log");
  const pid_t clean = start_train(job(dir, "clean"));
  ASSERT_EQ(wait_exit(clean), 0) << "the fault-free run failed";
  const std::string address = "127.0.0.1:" + std::to_string(dsgd::testing::free_port());
  const auto args =
      with(job(dir, "remote"), {"--listen", address, "--token", "t0ken", "--driver-state", state, "--no-from-peer"});
  const pid_t driver = start_train(args, log);
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(dsgd::testing::start_dsgd("worker", {"--driver", address, "--token", "t0ken"}, log));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (newest_step(state + "/checkpoints") < 30 && Clock::now() < deadline && !process_gone(driver)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(process_gone(driver)) << read_file(log);
  ::kill(driver, SIGKILL);
  ::waitpid(driver, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const pid_t again = start_train(args, log);
  ASSERT_EQ(wait_exit(again), 0) << read_file(log);
  for (pid_t w : workers) EXPECT_EQ(wait_exit(w), 0) << "worker " << w << " did not end with the job";
  const auto j = summary(dir.file("remote.json")), c = summary(dir.file("clean.json"));
  ASSERT_TRUE(j.is_object()) << read_file(log);
  EXPECT_EQ(j["test_loss"].get<double>(), c["test_loss"].get<double>()) << "the result is the fault-free run's";
  ASSERT_EQ(j["recoveries"].size(), 1u) << j.dump(2);
  EXPECT_EQ(j["recoveries"][0]["kind"], "driver_restart");
  EXPECT_EQ(j["recoveries"][0]["lost"], "") << "both workers were taken up";
  EXPECT_FALSE(j["recoveries"][0]["from_peer"].get<bool>()) << "the checkpoint was restored";
}

TEST(DriverRestart, ASecondDriverOfARunningJobOrAnotherJobsDirectoryIsRefused) {
  dsgd::testing::TempDir dir;
  const std::string state = dir.file("state"), log = dir.file("driver.log");
  const auto args = with(job(dir, "a", 1000), {"--driver-state", state});
  const pid_t first = start_train(args, log);
  ASSERT_EQ(children_of(first, 2).size(), 2u) << read_file(log);
  // Once its state names a checkpoint (the start's, step 0, at least).
  const auto has_checkpoint = [&] {
    const auto j = nlohmann::json::parse(read_file(state + "/driver.json"), nullptr, false);
    return j.is_object() && !j.value("checkpoint", std::string()).empty();
  };
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!has_checkpoint() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(has_checkpoint()) << read_file(log);
  std::string cmd;
  for (const auto& a : args) cmd += " '" + a + "'";
  const auto second = dsgd::testing::run_dsgd("train" + cmd);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("still runs (pid " + std::to_string(first) + ")"), std::string::npos) << second.output;
  ::kill(first, SIGKILL);
  ::waitpid(first, nullptr, 0);
  // The lost driver's job, asked for with other settings: refused, naming what to do.
  const auto other = dsgd::testing::run_dsgd("train" + cmd + " --lr 0.5");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("holds the state of another job"), std::string::npos) << other.output;
  // The same settings take it up; stopped by Ctrl-C, the job ends: its workers go too.
  const pid_t again = start_train(args, log);
  const auto t0 = Clock::now();
  while (read_file(log).find("the job goes on with 2 worker(s)") == std::string::npos && !process_gone(again) &&
         Clock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(read_file(log).find("the job goes on with 2 worker(s)"), std::string::npos) << read_file(log);
  ::kill(again, SIGINT);
  EXPECT_EQ(wait_exit(again), 130) << read_file(log);
  std::ifstream driver_json(state + "/driver.json");
  EXPECT_TRUE(nlohmann::json::parse(driver_json)["ended"].get<bool>());
}

}  // namespace
