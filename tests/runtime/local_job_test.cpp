// The in-process training job: loss falls, results are consistent and reproducible, bad options
// are rejected before any work.
#include "dsgd/apps/local_job.h"

#include <gtest/gtest.h>

#include "dsgd/common/error.h"

namespace dsgd::runtime {
namespace {

LocalJobOptions small_synthetic_job() {
  LocalJobOptions o;
  o.model = "mlp";
  o.dataset = "synthetic";
  o.synthetic_samples = 2048;
  o.synthetic_image_size = 8;
  o.batch_size = 32;
  o.lr = 0.01;
  o.epochs = 3;
  o.threads = 1;
  o.seed = 5;
  return o;
}

class Recorder : public ProgressListener {
 public:
  void on_batch(const BatchProgress& p) override { batches.push_back(p); }
  void on_epoch(const EpochSummary& s) override { epochs.push_back(s); }
  std::vector<BatchProgress> batches;
  std::vector<EpochSummary> epochs;
};

TEST(LocalJob, LossFallsAndAccuracyBeatsChance) {
  Recorder rec;
  LocalJobResult r = run_local_job(small_synthetic_job(), &rec);
  ASSERT_EQ(r.history.size(), 3u);
  EXPECT_LT(r.history[2].train_loss, 0.7 * r.history[0].train_loss);
  EXPECT_GT(r.test_accuracy, 0.3);  // 10 classes: chance is ~0.1
  EXPECT_EQ(r.steps, 3 * 64);
  EXPECT_EQ(r.samples, 3 * 2048);
  EXPECT_GT(r.samples_per_s, 0);
  EXPECT_GE(r.wall_s, r.train_s);
  ASSERT_EQ(rec.batches.size(), static_cast<size_t>(r.steps));
  EXPECT_EQ(rec.batches.back().step, rec.batches.back().total_steps);
  EXPECT_EQ(rec.batches[64].epoch, 2);
  EXPECT_EQ(rec.batches[64].batch, 1);
  ASSERT_EQ(rec.epochs.size(), 3u);
  EXPECT_DOUBLE_EQ(rec.epochs[2].test_accuracy, r.test_accuracy);
}

TEST(LocalJob, SameSeedSameResult) {
  auto o = small_synthetic_job();
  o.epochs = 1;
  LocalJobResult a = run_local_job(o);
  LocalJobResult b = run_local_job(o);
  EXPECT_DOUBLE_EQ(a.train_loss, b.train_loss);
  EXPECT_DOUBLE_EQ(a.test_accuracy, b.test_accuracy);
  o.seed = 6;
  EXPECT_NE(run_local_job(o).train_loss, a.train_loss);
}

TEST(LocalJob, MaxStepsStopsEarlyAndPartialBatchIsKept) {
  auto o = small_synthetic_job();
  o.synthetic_samples = 100;
  o.batch_size = 32;  // 4 batches per epoch: 32, 32, 32, 4
  o.evaluate = false;
  o.max_steps = 6;
  LocalJobResult r = run_local_job(o);
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(r.samples, 100 + 2 * 32);
  EXPECT_EQ(r.epochs, 2);
  EXPECT_EQ(r.test_accuracy, -1);
}

TEST(LocalJob, BadOptionsAreRejectedWithTheirValues) {
  auto expect_config_error = [](LocalJobOptions o, const std::string& needle) {
    try {
      validate(o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  LocalJobOptions o;
  expect_config_error([&] { auto x = o; x.model = "nope"; return x; }(), "unknown model 'nope'");
  expect_config_error([&] { auto x = o; x.dataset = "cifar"; return x; }(), "unknown dataset 'cifar'");
  expect_config_error([&] { auto x = o; x.epochs = 0; return x; }(), "epochs must be >= 1, got 0");
  expect_config_error([&] { auto x = o; x.batch_size = -4; return x; }(), "batch size must be >= 1, got -4");
  expect_config_error([&] { auto x = o; x.lr = 0; return x; }(), "learning rate must be a positive number");
  expect_config_error([&] { auto x = o; x.momentum = 1.5; return x; }(), "momentum must be in [0, 1)");
  expect_config_error([&] { auto x = o; x.threads = 0; return x; }(), "threads must be in 1..1024, got 0");
  expect_config_error([&] { auto x = o; x.max_steps = -1; return x; }(), "max steps must be >= 0");
  EXPECT_NO_THROW(validate(o));
}

TEST(LocalJob, MissingDataDirectoryIsADataError) {
  LocalJobOptions o;
  o.data_dir = "/nonexistent/dsgd-data";
  EXPECT_THROW(run_local_job(o), DataError);
}

}  // namespace
}  // namespace dsgd::runtime
