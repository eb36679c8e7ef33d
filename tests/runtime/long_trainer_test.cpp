// Full distributed training runs (label `long`): each strategy with 2 worker processes reaches
// the accuracy the single process does, with the demo's settings. ps puts the two workers on two
// pseudo-hosts, so each serves a shard and the pushes and pulls cross Gloo; so does ps_async
// (its default staleness bound, 4).
#include <gtest/gtest.h>

#include <filesystem>

#include "dsgd/data.h"
#include "dsgd/trainer.h"
#include "runtime/builtin_operators.h"

namespace dsgd {
namespace {

class LongTrainer : public ::testing::TestWithParam<const char*> {};

TEST_P(LongTrainer, TwoWorkersReach90PercentOnFashionMnist) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << data::kFashionMnistDir
                 << "; run scripts/install-deps.sh (package dataset-fashion-mnist)";
  }
  TrainerConfig c;  // the demo's settings (Makefile: demo)
  c.num_workers = 2;
  c.strategy = GetParam();
  c.batch_size = 64;
  c.threads_per_worker = 1;
  if (c.strategy == "ps" || c.strategy == "ps_async") c.local_hosts = 2;
  c.config = {{"model", "cnn"}, {"lr", 0.02}, {"lr_decay", 0.7}, {"momentum", 0.9}};
  Trainer trainer(runtime::kImageClassifier, c);
  double accuracy = 0;
  for (int epoch = 1; epoch <= 5; ++epoch) {
    auto t = trainer.train({.profile = true});
    auto v = trainer.validate();
    accuracy = v.metrics.at("accuracy");
    std::cout << GetParam() << " epoch " << epoch << ": train loss " << t.metrics.at("loss") << ", test accuracy "
              << accuracy << ", " << t.metrics.at("num_samples") / t.metrics.at("epoch_s") << " samples/s\n";
  }
  EXPECT_GE(accuracy, 0.90);
}

INSTANTIATE_TEST_SUITE_P(Strategies, LongTrainer, ::testing::Values("allreduce", "simple", "ps", "ps_async"));

}  // namespace
}  // namespace dsgd
