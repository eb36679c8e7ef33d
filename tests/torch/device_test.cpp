// Devices and precisions: what runs here (CPU autocast, the CUDA errors of a machine without a
// GPU), and what runs on a GPU machine only (bench/gpu/run.sh; each such test skips, saying why,
// where LibTorch sees no CUDA device).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <thread>

#include "dsgd/common/error.h"
#include "dsgd/torch/sgd.h"
#include "torch/replica/device.h"
#include "torch/sync/grad_sync.h"

namespace dsgd::torch_glue {
namespace {

#define SKIP_WITHOUT_CUDA()                                                                       \
  if (!torch::cuda::is_available()) {                                                            \
    GTEST_SKIP() << "LibTorch sees no CUDA device (Debian's LibTorch has no CUDA): runs on a GPU " \
                    "machine (bench/gpu/run.sh)";                                                 \
  }

TEST(Device, AutoIsTheCpuWithoutAGpuAndCudaThenSaysWhatToDo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a GPU: auto is CUDA here";
  EXPECT_EQ(replica_device(Device::kAuto, 3), torch::Device(torch::kCPU));
  EXPECT_EQ(replica_device(Device::kCpu, 0), torch::Device(torch::kCPU));
  try {
    replica_device(Device::kCuda, 0);
    FAIL() << "device cuda without a GPU";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use device cpu or auto"), std::string::npos) << e.what();
  }
}

TEST(Device, ReplicasShareTheGpusRoundRobin) {
  SKIP_WITHOUT_CUDA();
  const auto n = static_cast<int>(torch::cuda::device_count());
  EXPECT_EQ(replica_device(Device::kAuto, 0), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(replica_device(Device::kCuda, n), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(replica_device(Device::kCpu, 1), torch::Device(torch::kCPU));
}

TEST(Device, Bf16AutocastRunsMatmulsInBf16UntilTheScopeEnds) {
  for (const auto type : {torch::kCPU, torch::kCUDA}) {
    if (type == torch::kCUDA && !torch::cuda::is_available()) continue;
    const torch::Device device(type);
    auto a = torch::randn({8, 8}, torch::TensorOptions().device(device));
    {
      AutocastScope fp32(device, Precision::kFp32);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
    }
    {
      AutocastScope bf16(device, Precision::kBf16);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16) << device;
      EXPECT_EQ((a + a).scalar_type(), torch::kFloat32) << "autocast leaves element-wise ops alone";
    }
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32) << "the scope's end restores float32";
  }
}

TEST(Device, AllFiniteFindsOneNanAmongManyTensors) {
  for (const auto type : {torch::kCPU, torch::kCUDA}) {
    if (type == torch::kCUDA && !torch::cuda::is_available()) continue;
    const auto o = torch::TensorOptions().device(type);
    std::vector<torch::Tensor> t{torch::ones({100}, o), torch::zeros({3, 3}, o), torch::ones({7}, o)};
    EXPECT_TRUE(all_finite(t));
    t[2][3] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(all_finite(t));
    EXPECT_EQ(t[0].sum().item<float>(), 100.0f) << "the check leaves the tensors as they were";
  }
}

// FusedSGD's multi-tensor step is torch::optim::SGD's arithmetic: the same parameters after a
// few steps, with momentum, dampening, weight decay and Nesterov.
TEST(FusedSgd, StepsLikeLibTorchsSgdOnCuda) {
  SKIP_WITHOUT_CUDA();
  for (const bool nesterov : {false, true}) {
    torch::manual_seed(3);
    torch::nn::Linear a(16, 8), b(16, 8);
    a->to(torch::kCUDA);
    b->to(torch::kCUDA);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
    auto o = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3).nesterov(nesterov).dampening(0);
    torch::optim::SGD reference(a->parameters(), o);
    FusedSGD fused(b->parameters(), o);
    for (int step = 0; step < 5; ++step) {
      for (size_t i = 0; i < a->parameters().size(); ++i) {
        auto g = torch::randn_like(a->parameters()[i]);
        a->parameters()[i].mutable_grad() = g.clone();
        b->parameters()[i].mutable_grad() = g.clone();
      }
      reference.step();
      fused.step();
    }
    for (size_t i = 0; i < a->parameters().size(); ++i) {
      EXPECT_LT((a->parameters()[i] - b->parameters()[i]).abs().max().item<double>(), 1e-6)
          << "parameter " << i << (nesterov ? ", Nesterov" : "");
    }
    EXPECT_EQ(fused.state().size(), reference.state().size()) << "a momentum buffer per parameter";
  }
}

// Sums in place on its own thread, like a real strategy over host memory.
class Double : public strategy::GradientStrategy {
 public:
  ~Double() override {
    for (auto& t : threads_) t.join();
  }
  std::string name() const override { return "double"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    auto w = std::make_shared<comm::Work>("bucket");
    threads_.emplace_back([data, count, w] {
      for (size_t i = 0; i < count; ++i) data[i] *= 2;
      w->complete();
    });
    return w;
  }
  void abort(const std::string&) override {}

 private:
  std::vector<std::thread> threads_;
};

// CUDA gradients go to the strategy through host memory and come back as .grad on the device.
TEST(GradSyncCuda, StagesBucketsThroughTheHostAndGradStaysOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  torch::nn::Linear a(32, 16), b(16, 4);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  auto params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  auto x = torch::randn({8, 32}, torch::kCUDA);
  auto loss = [&] { return b(torch::relu(a(x))).pow(2).sum(); };
  loss().backward();
  std::vector<torch::Tensor> plain;
  for (auto& p : params) {
    plain.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  GradSync sync(params, /*grad_shard_bytes=*/256, std::make_shared<Double>());  // several buckets
  ASSERT_GT(sync.num_buckets(), 2u);
  for (int step = 0; step < 3; ++step) {
    loss().backward();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().is_cuda());
      EXPECT_TRUE(torch::allclose(params[i].grad(), plain[i] * 2, 1e-5, 1e-6))
          << "step " << step << ", parameter " << i;
    }
    EXPECT_TRUE(sync.last_finite());
  }
}

}  // namespace
}  // namespace dsgd::torch_glue
