// Models defined in Python and saved as TorchScript, trained by the C++ workers (`--model
// file.pt`): the same parameters as the C++ model from the same start, checkpoints, model.pt
// back for torch.jit.load, and clear errors. The files are made by tests/python/scripted_models.py
// with Debian's python3-torch (scripts/install-deps.sh installs it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/models/registry.h"
#include "dsgd/runtime/trainer.h"
#include "testing/params.h"
#include "testing/temp_dir.h"

#ifndef DSGD_SOURCE_DIR
#error "DSGD_SOURCE_DIR must name the source tree (tests/CMakeLists.txt)"
#endif

namespace dsgd {
namespace {

using testing::max_difference;
using testing::Params;
using testing::params_of;

// Runs tests/python/scripted_models.py with Debian's python3 (the one with torch).
std::string make_scripted(const testing::TempDir& dir, const std::string& model, const std::string& flags = "",
                          const std::string& file = "") {
  const std::string out = dir.file(file.empty() ? model + ".pt" : file);
  const std::string cmd = "/usr/bin/python3 " DSGD_SOURCE_DIR "/tests/python/scripted_models.py " + model + " " + out +
                          " " + flags;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << ": needs python3-torch (scripts/install-deps.sh)";
  return out;
}

TrainerConfig job(const std::string& model) {
  TrainerConfig c{.num_workers = 2, .strategy = "allreduce", .batch_size = 64, .device = "cpu", .seed = 7,
                  .threads_per_worker = 1};
  c.config = {{"model", model}, {"dataset", "synthetic"}, {"synthetic_samples", 2048}, {"lr", 0.01},
              {"momentum", 0.9}, {"dropout", false}};
  return c;
}

// The Python CNN, given the C++ CNN's initial weights, trains to its parameters: the workers run
// the script's forward and backward under the same averaging, momentum and data.
TEST(ScriptedModel, APythonCnnWithTheCppCnnsWeightsTrainsToItsParameters) {
  register_builtin_operators();
  testing::TempDir dir;
  Params start, cpp;
  {
    Trainer t(kImageClassifier, job("cnn"));
    start = params_of(*t.get_model());
    t.train({.num_steps = 20});
    cpp = params_of(*t.get_model());
  }
  // The script's weights replaced by the C++ model's start, under the same names.
  auto script = models::ScriptedModel::load(make_scripted(dir, "cnn", "--no-dropout"));
  {
    torch::NoGradGuard no_grad;
    auto mine = script->named_parameters();
    ASSERT_EQ(mine.size(), start.size());
    for (const auto& [name, value] : start) mine[name].copy_(value);
  }
  const std::string same_start = dir.file("same-start.pt");
  std::ofstream(same_start, std::ios::binary) << script->model_file();

  Trainer t(kImageClassifier, job(same_start));
  EXPECT_EQ(max_difference(start, params_of(*t.get_model())), 0);
  t.train({.num_steps = 20});
  const auto trained = t.get_model();
  ASSERT_NE(std::dynamic_pointer_cast<models::ScriptedModel>(trained), nullptr);
  const double difference = max_difference(cpp, params_of(*trained));
  EXPECT_LT(difference, 1e-5);
  std::cout << "scripted CNN after 20 steps: " << difference << " from the C++ CNN\n";

  // A checkpoint: model.pt is the trained script; the shares load into a new job.
  t.save(dir.file("ckpt"));
  const auto back = models::ScriptedModel::load(dir.file("ckpt") + "/model.pt");
  EXPECT_EQ(max_difference(params_of(*trained), params_of(*back)), 0);
  Trainer resumed(kImageClassifier, job(same_start));
  resumed.load(dir.file("ckpt"));
  EXPECT_EQ(max_difference(params_of(*trained), params_of(*resumed.get_model())), 0);
}

// BatchNorm's running statistics are buffers: they travel as the parameters do, and eval mode
// reaches the script (validation uses them).
TEST(ScriptedModel, BuffersAndTrainingModeReachTheScript) {
  testing::TempDir dir;
  auto net = models::ScriptedModel::load(make_scripted(dir, "bn-cnn"));
  const auto buffers = net->named_buffers();
  ASSERT_TRUE(buffers.contains("features.1.running_mean")) << "BatchNorm's buffers under Python's names";
  const torch::Tensor mean = buffers["features.1.running_mean"];
  const auto x = torch::randn({8, 1, 28, 28});
  net->train();
  net->forward(x);
  EXPECT_GT(mean.abs().sum().item<double>(), 0) << "a training forward moves the running mean";
  net->eval();
  const auto before = mean.clone();
  const auto a = net->forward(x), b = net->forward(x);
  EXPECT_TRUE(torch::equal(mean, before)) << "eval mode leaves the statistics";
  EXPECT_TRUE(torch::equal(a, b)) << "eval mode: no dropout";
}

TEST(ScriptedModel, BadFilesAreConfigErrorsNamingThem) {
  register_builtin_operators();
  testing::TempDir dir;
  auto expect_error = [](const TrainerConfig& c, const std::string& part) {
    try {
      Trainer t(kImageClassifier, c);
      t.train({.num_steps = 1});
      ADD_FAILURE() << "no error for " << c.config.dump();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error(job(dir.file("missing.pt")), "model file '" + dir.file("missing.pt") + "' not found");
  std::ofstream(dir.file("text.pt")) << "not a model";
  expect_error(job(dir.file("text.pt")), "torch.jit.load cannot read it");
  // Logits for 5 classes where the data has 10.
  expect_error(job(make_scripted(dir, "cnn", "--classes 5")), "returns [2, 5] for images [2, 1, 28, 28]");
}

}  // namespace
}  // namespace dsgd
