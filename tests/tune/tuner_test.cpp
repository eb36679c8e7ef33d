// Searches over real Trainer jobs (a small MLP on synthetic images, a few steps an iteration):
// every trial reports and checkpoints; a finished search run again runs nothing; ASHA stops the
// trials that fall behind; PBT's worst trial takes a better one's state and perturbed values;
// bad searches fail before anything runs.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/tune/tuner.h"
#include "testing/temp_dir.h"

namespace dsgd {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

TrainerConfig small_job() {
  TrainerConfig c;
  c.num_workers = 1;
  c.threads_per_worker = 1;
  c.batch_size = 32;
  c.config = {{"model", "mlp"}, {"dataset", "synthetic"}, {"synthetic_samples", 512}, {"synthetic_image_size", 8}};
  return c;
}

TuneOptions options(const std::string& dir, const std::string& scheduler) {
  TuneOptions o;
  o.dir = dir;
  o.scheduler = scheduler;
  o.num_trials = 1;
  o.max_iterations = 2;
  o.steps_per_iteration = 4;
  o.metric = "train_loss";
  o.mode = "min";
  o.cores = 1;
  return o;
}

TEST(Tuner, FifoRunsEveryTrialToTheEndAndTheSameSearchAgainRunsNothing) {
  testing::TempDir dir;
  const auto space =
      SearchSpace::parse(R"({"lr": {"grid": [0.01, 0.1]}, "momentum": {"uniform": [0.5, 0.9]}})", "space");
  auto o = options(dir.file("search"), "fifo");
  std::atomic<int> reports{0};
  o.on_report = [&](const json&) { ++reports; };
  const TuneResult r = Tuner(kImageClassifier, small_job(), space, o).run();
  ASSERT_EQ(r.trials.size(), 2u);  // 1 sample x 2 grid points
  EXPECT_EQ(reports, 4);
  EXPECT_EQ(r.iterations, 4);
  for (const auto& t : r.trials) {
    EXPECT_EQ(t["state"], "done");
    ASSERT_EQ(t["history"].size(), 2u);
    EXPECT_TRUE(t["history"][1].contains("train_loss"));
    EXPECT_TRUE(t["history"][1].contains("test_accuracy"));
    EXPECT_TRUE(fs::exists(fs::path(t["checkpoint"].get<std::string>()) / "manifest.json"));
  }
  EXPECT_GE(r.best, 0);
  const json out = r.to_json(o);
  EXPECT_TRUE(out["best"].contains("train_loss"));
  EXPECT_EQ(out["trials_stopped_early"], 0);
  EXPECT_EQ(r.trials[0]["params"]["lr"], 0.01);
  EXPECT_EQ(r.trials[1]["params"]["lr"], 0.1);

  reports = 0;
  const TuneResult again = Tuner(kImageClassifier, small_job(), space, o).run();
  EXPECT_EQ(reports, 0) << "a finished trial ran again";
  EXPECT_EQ(again.trials, r.trials);

  auto other = o;
  other.max_iterations = 3;
  EXPECT_THROW(Tuner(kImageClassifier, small_job(), space, other).run(), ConfigError) << "another search in the dir";
}

// lr 1e-5 barely moves the loss; 0.2 does. Trials run one at a time in order (1 core), so the
// small rates reach the first rung behind a large one and stop there.
TEST(Tuner, AshaStopsTrialsThatFallBehindAtARung) {
  testing::TempDir dir;
  const auto space = SearchSpace::parse(R"({"lr": {"grid": [0.2, 0.00001, 0.2, 0.00001]}})", "space");
  auto o = options(dir.file("asha"), "asha");
  o.max_iterations = 4;
  o.grace_period = 1;
  o.reduction_factor = 2;
  const TuneResult r = Tuner(kImageClassifier, small_job(), space, o).run();
  ASSERT_EQ(r.trials.size(), 4u);
  EXPECT_EQ(r.trials[1]["state"], "stopped");
  EXPECT_EQ(r.trials[1]["history"].size(), 1u);
  EXPECT_EQ(r.trials[3]["state"], "stopped");
  EXPECT_EQ(r.trials[0]["state"], "done");
  EXPECT_GE(r.stopped_early, 2);
  EXPECT_LT(r.iterations, 16);
  EXPECT_EQ(r.trials[static_cast<size_t>(r.best)]["params"]["lr"], 0.2);
}

// Two trials, one hopeless: after the first round the worse takes the better's checkpoint and
// its values perturbed (no resampling), then trains on from there.
TEST(Tuner, PbtsWorstTrialTakesTheBestOnesStateAndPerturbedValues) {
  testing::TempDir dir;
  const auto space = SearchSpace::parse(R"({"lr": {"grid": [0.2, 0.00001]}, "momentum": 0.5})", "space");
  auto o = options(dir.file("pbt"), "pbt");
  o.max_iterations = 3;
  o.perturbation_interval = 1;
  o.quantile = 0.5;
  o.resample_probability = 0;
  o.cores = 2;
  const TuneResult r = Tuner(kImageClassifier, small_job(), space, o).run();
  ASSERT_EQ(r.trials.size(), 2u);
  const auto& loser = r.trials[1];
  ASSERT_GE(loser["exploited"].size(), 1u) << loser.dump();
  EXPECT_EQ(loser["exploited"][0]["from"], 0);
  EXPECT_EQ(loser["exploited"][0]["iteration"], 1);
  const double lr = loser["exploited"][0]["params"]["lr"].get<double>();
  EXPECT_TRUE(lr == 0.2 || lr == 0.00001) << lr;  // a grid value moves to a neighbour in its list
  EXPECT_EQ(loser["history"].size(), 3u);
  // Round 1 it trained from scratch at 1e-5; round 2 from trial 0's state: its loss drops to
  // trial 0's neighbourhood at once.
  const double before = loser["history"][0]["train_loss"].get<double>();
  const double after = loser["history"][1]["train_loss"].get<double>();
  const double winner = r.trials[0]["history"][1]["train_loss"].get<double>();
  EXPECT_LT(after, before);
  EXPECT_LT(std::fabs(after - winner), std::fabs(before - winner));
}

TEST(Tuner, BadSearchesFailBeforeAnythingRuns) {
  testing::TempDir dir;
  const auto space = SearchSpace::parse(R"({"lr": {"choice": [0.01, 0.1]}})", "space");
  auto says = [&](TuneOptions o, const std::string& what, const SearchSpace& s) {
    try {
      Tuner t(kImageClassifier, small_job(), s, o);
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto o = options(dir.file("bad"), "fifo");
  auto x = o;
  x.scheduler = "hyperband";
  says(x, "unknown scheduler 'hyperband'", space);
  x = o;
  x.cores = 100000;
  says(x, "cores must be in", space);
  x = o;
  x.dir = "";
  says(x, "a dir is required", space);
  says(o, "unknown image classifier config key 'learning_rate'",
       SearchSpace::parse(R"({"learning_rate": {"choice": [0.1]}})", "space"));
  says(o, "needs 2 cores", SearchSpace::parse(R"({"num_workers": {"choice": [2]}})", "space"));
  EXPECT_FALSE(fs::exists(dir.file("bad")));
}

}  // namespace
}  // namespace dsgd
