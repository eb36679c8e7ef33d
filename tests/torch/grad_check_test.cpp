// GradCheck: .grad ends as LibTorch alone would leave it (zeroed and accumulated, set to none,
// accumulated over backwards), in the same storage where LibTorch keeps it, and every NaN or
// infinity is found, whichever backward since the last take() made it.
#include "torch/replica/grad_check.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace dsgd::torch_glue {
namespace {

struct Net {
  torch::nn::Linear a{4, 3}, b{3, 2};
  std::vector<torch::Tensor> params() {
    auto p = a->parameters();
    for (auto& q : b->parameters()) p.push_back(q);
    return p;
  }
  torch::Tensor loss(const torch::Tensor& x) { return b(torch::tanh(a(x))).pow(2).sum(); }
};

// Each parameter's .grad after backward(s) of x1 (and x2), without GradCheck.
std::vector<torch::Tensor> plain(Net& net, const torch::Tensor& x1, const torch::Tensor& x2 = {}) {
  for (auto& p : net.params()) p.mutable_grad() = torch::zeros_like(p);
  net.loss(x1).backward();
  if (x2.defined()) net.loss(x2).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : net.params()) g.push_back(p.grad().clone());
  return g;
}

void expect_grads(Net& net, const std::vector<torch::Tensor>& expected, const char* where) {
  const auto params = net.params();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].grad(), expected[i])) << where << ", parameter " << i;
  }
}

TEST(GradCheck, GradIsWhatLibTorchMakesInTheSameStorage) {
  torch::manual_seed(1);
  Net net;
  const auto x1 = torch::randn({5, 4}), x2 = torch::randn({5, 4});
  const auto one = plain(net, x1), two = plain(net, x1, x2);
  GradCheck check(net.params());
  torch::optim::SGD opt(net.params(), torch::optim::SGDOptions(0.1));
  for (auto& p : net.params()) p.mutable_grad() = torch::zeros_like(p);
  std::vector<const void*> storage;
  for (auto& p : net.params()) storage.push_back(p.grad().data_ptr());
  opt.zero_grad();  // zeroes in place (LibTorch 1.13)
  net.loss(x1).backward();
  expect_grads(net, one, "zeroed, one backward");
  net.loss(x2).backward();
  expect_grads(net, two, "accumulated over two backwards");
  EXPECT_TRUE(check.take());
  for (size_t i = 0; i < storage.size(); ++i) EXPECT_EQ(net.params()[i].grad().data_ptr(), storage[i]) << i;
  for (auto& p : net.params()) p.mutable_grad() = torch::Tensor();  // set to none
  net.loss(x1).backward();
  expect_grads(net, one, "set to none");
  EXPECT_TRUE(check.take());
}

TEST(GradCheck, ANonFiniteGradientInAnyBackwardIsFoundOnce) {
  torch::manual_seed(2);
  Net net;
  GradCheck check(net.params());
  const auto x = torch::randn({5, 4});
  auto bad = x.clone();
  bad[2][1] = std::nanf("");
  for (bool zeroed : {true, false}) {  // zeroed: the in-place path; else .grad set to none
    for (int which = 0; which < 2; ++which) {  // NaN in the first or the second of two backwards
      for (auto& p : net.params()) p.mutable_grad() = zeroed ? torch::zeros_like(p) : torch::Tensor();
      net.loss(which == 0 ? bad : x).backward();
      net.loss(which == 1 ? bad : x).backward();
      EXPECT_FALSE(check.take()) << zeroed << " " << which;
      EXPECT_TRUE(check.take()) << "taken: " << zeroed << " " << which;
    }
  }
  auto inf = x.clone();
  inf[0][0] = INFINITY;
  for (auto& p : net.params()) p.mutable_grad() = torch::zeros_like(p);
  net.loss(inf).backward();
  EXPECT_FALSE(check.take());
}

// A gradient that is not a contiguous float32 tensor goes the way LibTorch takes it, and is
// still checked: (w.t() * y).sum() gives w the transposed y.
TEST(GradCheck, OtherGradientsAreCheckedAsLibTorchAccumulatesThem) {
  auto w = torch::randn({3, 4}, torch::requires_grad());
  GradCheck check({w});
  auto y = torch::randn({4, 3});
  w.mutable_grad() = torch::ones({3, 4});
  (w.t() * y).sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), y.t() + 1));
  EXPECT_TRUE(check.take());
  y[3][0] = INFINITY;
  (w.t() * y).sum().backward();
  EXPECT_FALSE(check.take());
  auto d = torch::randn({2}, torch::dtype(torch::kFloat64).requires_grad(true));
  GradCheck doubles({d});
  (d * std::numeric_limits<double>::infinity()).sum().backward();
  EXPECT_FALSE(doubles.take());
}

TEST(GradCheck, HooksGoWithIt) {
  Net net;
  const auto x = torch::randn({5, 4});
  auto bad = x.clone();
  bad[0][0] = std::nanf("");
  { GradCheck check(net.params()); }
  net.loss(bad).backward();  // no hook left to call into the destroyed check
  GradCheck fresh(net.params());
  EXPECT_TRUE(fresh.take());
}

}  // namespace
}  // namespace dsgd::torch_glue
