// GradSync against a strategy whose "average" is a known function (x / 2 + 1), so every .grad
// after backward can be checked exactly: over several steps and optimizer steps (from the
// second backward on, .grad is the bucket slot and zero_grad() zeroes it in place), with
// weights, with .grad cleared by the caller or not zeroed, and after Module::load (which set_()s
// the parameters and gives them new AccumulateGrad nodes).
#include "torch/grad_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

namespace dsgd::torch_glue {
namespace {

// Works on its own thread, as real strategies do, a little later than asked.
class HalfPlusOne : public strategy::GradientStrategy {
 public:
  ~HalfPlusOne() override {
    for (auto& t : threads_) t.join();
  }
  std::string name() const override { return "half-plus-one"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    ++calls;
    auto w = std::make_shared<comm::Work>("test bucket");
    threads_.emplace_back([data, count, w] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (size_t i = 0; i < count; ++i) data[i] = data[i] / 2 + 1;
      w->complete();
    });
    return w;
  }
  void abort(const std::string&) override {}
  int calls = 0;

 private:
  std::vector<std::thread> threads_;
};

struct Fixture {
  torch::nn::Linear a{4, 3}, b{3, 2};
  std::shared_ptr<HalfPlusOne> strategy = std::make_shared<HalfPlusOne>();
  std::vector<torch::Tensor> params() {
    auto p = a->parameters();
    for (auto& q : b->parameters()) p.push_back(q);
    return p;
  }
  torch::Tensor loss(const torch::Tensor& x) { return b(torch::relu(a(x))).pow(2).sum(); }
};

// The plain gradients of loss(x), computed without GradSync.
std::vector<torch::Tensor> plain_grads(Fixture& f, const torch::Tensor& x) {
  for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();
  f.loss(x).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : f.params()) g.push_back(p.grad().clone());
  return g;
}

// Every parameter's .grad is HalfPlusOne's result for weight x its plain gradient.
void expect_grads(Fixture& f, const std::vector<torch::Tensor>& plain, double weight, const std::string& where) {
  const auto params = f.params();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), plain[i] * weight / 2 + 1, 1e-5, 1e-6))
        << where << ", parameter " << i;
  }
}

TEST(GradSync, EveryStepGradIsTheStrategysResultOfThatStepsGradient) {
  torch::manual_seed(1);
  Fixture f;
  torch::optim::SGD opt(f.params(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    const auto x = torch::randn({5, 4});
    const auto expected = plain_grads(f, x);
    {
      GradSync sync(f.params(), /*grad_shard_bytes=*/32, f.strategy);
      for (int inner = 0; inner < 3; ++inner) {
        opt.zero_grad();
        f.loss(x).backward();
        expect_grads(f, expected, 1.0, "step " + std::to_string(step) + " inner " + std::to_string(inner));
        EXPECT_TRUE(sync.last_finite());
      }
    }
    opt.step();
  }
  EXPECT_GT(f.strategy->calls, 4);
}

TEST(GradSync, WeightScalesTheGradientBeforeTheStrategy) {
  torch::manual_seed(2);
  Fixture f;
  const auto x = torch::randn({5, 4});
  const auto expected = plain_grads(f, x);
  GradSync sync(f.params(), 1 << 20, f.strategy);
  sync.set_weight(3.0);
  torch::optim::SGD opt(f.params(), torch::optim::SGDOptions(0.1));
  for (int inner = 0; inner < 3; ++inner) {
    opt.zero_grad();
    f.loss(x).backward();
    expect_grads(f, expected, 3.0, "inner " + std::to_string(inner));
  }
}

TEST(GradSync, EachBackwardAveragesItsOwnGradientWhateverGradHeld) {
  torch::manual_seed(3);
  Fixture f;
  const auto x = torch::randn({5, 4});
  const auto expected = plain_grads(f, x);
  GradSync sync(f.params(), 1 << 20, f.strategy);
  for (int inner = 0; inner < 3; ++inner) {
    for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();  // set_to_none, as Python does
    f.loss(x).backward();
    expect_grads(f, expected, 1.0, "inner " + std::to_string(inner));
  }
  // Without zero_grad: still the one backward's gradient, not a sum with the last average.
  f.loss(x).backward();
  expect_grads(f, expected, 1.0, "without zero_grad");
}

TEST(GradSync, ANonFiniteGradientIsReported) {
  Fixture f;
  GradSync sync(f.params(), 1 << 20, f.strategy);
  auto x = torch::randn({5, 4});
  x[0][0] = std::numeric_limits<float>::infinity();
  f.loss(x).backward();
  EXPECT_FALSE(sync.last_finite());
  for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();
  f.loss(torch::randn({5, 4})).backward();
  EXPECT_TRUE(sync.last_finite());
}

}  // namespace
}  // namespace dsgd::torch_glue

namespace dsgd::torch_glue {
namespace {
TEST(GradSync, HooksSurviveLoadingTheModel) {
  torch::manual_seed(4);
  Fixture f;
  const auto x = torch::randn({5, 4});
  const auto expected = plain_grads(f, x);
  GradSync sync(f.params(), 1 << 20, f.strategy);
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive out;
    f.a->save(out);
    out.save_to(buffer);
  }
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  f.a->load(in);
  for (int inner = 0; inner < 2; ++inner) {
    for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();
    f.loss(x).backward();
    expect_grads(f, expected, 1.0, "inner " + std::to_string(inner));
  }
}
}  // namespace
}  // namespace dsgd::torch_glue
