// On a GPU machine (bench/gpu/run.sh); each test skips, saying why, without one.
#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

// Two worker processes sharing one GPU (their gradients staged through host shared memory)
// against one process with the global batch: the MLP's float32 matmuls (no TF32 by default),
// 20 steps. The one GPU process also ends where the CPU does.
TEST(TrainerGpu, TwoProcessesOnOneGpuEqualOneProcessWithTheGlobalBatch) {
  SKIP_WITHOUT_CUDA();
  Trainer one(dsgd::kImageClassifier, gpu_config(1, "mlp"));
  const Params before = params_of(*one.get_model());
  EXPECT_EQ(one.train({.num_steps = 20}).batch, 20);
  const double vs_cpu =
      max_difference(single_process(64, 20, gpu_config(1, "mlp").config), params_of(*one.get_model()));
  std::cout << "1 process on the GPU vs the CPU, 20 steps: max parameter difference " << vs_cpu << "\n";
  EXPECT_LT(vs_cpu, 1e-4);
  Trainer two(dsgd::kImageClassifier, gpu_config(2, "mlp"));
  EXPECT_EQ(two.train({.num_steps = 20}).batch, 20);
  const Params a = params_of(*one.get_model()), b = params_of(*two.get_model());
  EXPECT_GT(max_difference(before, a), 1e-3) << "training did not move the parameters";
  const double difference = max_difference(a, b);
  std::cout << "2 processes on one GPU vs 1 process, 20 steps: max parameter difference " << difference << "\n";
  EXPECT_LT(difference, 1e-4);
}

// On a GPU the image classifier lays out its convolutions channels_last unless told not to, and
// trains as the plain layout does (cuDNN's kernels differ: the parameters differ by rounding).
TEST(TrainerGpu, ChannelsLastIsTheDefaultForConvolutionsAndTrainsLikeNchw) {
  SKIP_WITHOUT_CUDA();
  std::map<std::string, Params> runs;
  Params before;
  for (const bool channels_last : {true, false}) {
    TrainerConfig c = gpu_config(1, "cnn");
    if (!channels_last) c.config["channels_last"] = false;
    Trainer t(dsgd::kImageClassifier, c);
    const std::string expected = channels_last ? "channels_last" : "nchw";
    EXPECT_EQ(t.foreach_worker("conv_layout").at(0), expected);
    before = params_of(*t.get_model());
    t.train({.num_steps = 20});
    runs[expected] = params_of(*t.get_model());
  }
  EXPECT_GT(max_difference(before, runs["nchw"]), 1e-3) << "training did not move the parameters";
  const double difference = max_difference(runs["channels_last"], runs["nchw"]);
  std::cout << "channels_last vs NCHW on the GPU, CNN, 20 steps: max parameter difference " << difference << "\n";
  EXPECT_LT(difference, 1e-3);
}

// bf16 autocast on the GPU, 2 processes sharing it: the CNN trains to where float32 does, by
// another path (the parameters differ, so autocast did change the arithmetic).
TEST(TrainerGpu, Bf16AutocastTrainsTheCnnLikeFloat32) {
  SKIP_WITHOUT_CUDA();
  expect_trains_like_fp32(gpu_config(2, "cnn"), Precision::kBf16, 5, 40, 0.2);
}

// float16 autocast with dynamic loss scaling (65536 by default): trains like float32, 2 replicas
// stay identical, and a scale that overflows at once backs off until steps are taken.
TEST(TrainerGpu, Fp16AutocastWithLossScalingTrainsTheCnnLikeFloat32) {
  SKIP_WITHOUT_CUDA();
  expect_trains_like_fp32(gpu_config(2, "cnn"), Precision::kFp16, 5, 40, 0.2);
  TrainerConfig c = gpu_config(2, "cnn");
  c.step.precision = "fp16";
  c.config["lr"] = 0.05;
  Trainer t(dsgd::kImageClassifier, c);
  EXPECT_EQ(t.train({.num_steps = 5}).metrics.at("loss_scale"), 65536.0);
  c.step.loss_scale = 0x1p40;  // float16 activation gradients overflow at once: backs off, then trains
  Trainer high(dsgd::kImageClassifier, c);
  auto r = high.train({.num_steps = 40});
  std::cout << "from 2^40: " << r.metrics.at("skipped_steps") << " steps skipped, scale now "
            << r.metrics.at("loss_scale") << "\n";
  EXPECT_GT(r.metrics.at("skipped_steps"), 0.0);
  EXPECT_LT(r.metrics.at("skipped_steps"), 40.0);
  EXPECT_LT(r.metrics.at("loss_scale"), 0x1p40);
}

// ZeRO stage 1 with the parameters on the GPU (the shares summed through the host copy, as the
// gradients are): two processes sharing the GPU end where plain allreduce does, the GPT with
// AdamW. The bound allows for LibTorch's fused attention, whose backward on CUDA adds in no fixed
// order; replicas that kept the others' old parameters would be ~1e-2 apart.
TEST(TrainerGpu, ZeroStage1OnTheGpuEqualsPlainAllreduce) {
  SKIP_WITHOUT_CUDA();
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, 20);
  c.device = "cuda";
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-4);
}

}  // namespace
}  // namespace dsgd
