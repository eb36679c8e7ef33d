// Full training runs (label `long`, minutes each): the accuracy the demo promises.
#include <gtest/gtest.h>

#include <filesystem>

#include "dsgd/data/datasets.h"
#include "dsgd/apps/local_job.h"

namespace dsgd::runtime {
namespace {

TEST(LongTraining, CnnReaches90PercentOnFashionMnist) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << data::kFashionMnistDir
                 << "; run scripts/install-deps.sh (package dataset-fashion-mnist)";
  }
  LocalJobOptions o;  // the demo's settings (Makefile: demo)
  o.model = "cnn";
  o.epochs = 3;  // 2,814 steps of batch 64: the demo's 90% (2 x 64 a step) comes in its second or third epoch
  o.batch_size = 64;
  o.lr = 0.02;
  o.lr_decay = 0.7;
  o.momentum = 0.9;
  o.threads = 2;
  LocalJobResult r = run_local_job(o);
  std::cout << "test accuracy " << r.test_accuracy << ", " << r.samples_per_s << " samples/s, " << r.wall_s
            << " s\n";
  EXPECT_GE(r.test_accuracy, 0.90);
}

}  // namespace
}  // namespace dsgd::runtime
