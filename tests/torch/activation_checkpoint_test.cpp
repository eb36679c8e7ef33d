// Activation checkpointing (dsgd/torch/activation_checkpoint.h) against the same unit run plainly:
// equal gradients (input and parameters), with dropout, BatchNorm's statistics and bf16 autocast;
// each parameter's hook called once, from the outer backward; activations not kept.
#include "dsgd/torch/activation_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <memory>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "dsgd/common/error.h"
#include "torch/nn/autocast_state.h"

namespace {

// A unit that draws random numbers, updates buffers and has parameters.
struct UnitImpl : torch::nn::Module {
  UnitImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        bn(register_module("bn", torch::nn::BatchNorm1d(16))),
        drop(register_module("drop", torch::nn::Dropout(0.3))),
        fc2(register_module("fc2", torch::nn::Linear(16, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(drop(torch::gelu(bn(fc1(x))))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Unit);

struct Run {
  torch::Tensor out, input_grad, rng_after;
  std::vector<torch::Tensor> grads, buffers;
};

// Two units in a row (the second's backward runs first), from the same seed and weights.
Run run(bool checkpointed, bool bf16 = false, uint64_t seed = 7) {
  torch::manual_seed(seed);
  Unit a, b;
  if (checkpointed) {
    dsgd::checkpoint_activations(*a);
    dsgd::checkpoint_activations(*b);
  }
  auto x = torch::randn({32, 8}, torch::requires_grad());
  torch::Tensor y;
  {
    const auto was = dsgd::torch_glue::autocast_state(torch::kCPU);
    dsgd::torch_glue::set_autocast_state(torch::kCPU, {bf16, torch::kBFloat16});
    auto fa = [&](const torch::Tensor& in) { return a->forward(in); };
    auto fb = [&](const torch::Tensor& in) { return b->forward(in); };
    y = dsgd::run_checkpointed(*b, dsgd::run_checkpointed(*a, x, fa), fb);
    dsgd::torch_glue::set_autocast_state(torch::kCPU, was);
    at::autocast::clear_cache();
  }
  EXPECT_EQ(y.grad_fn()->name() == "dsgd::CheckpointedUnitBackward", checkpointed);
  y.to(torch::kFloat32).pow(2).sum().backward();
  const auto rng = at::globalContext().defaultGenerator(torch::kCPU).get_state();
  Run r{y.detach().to(torch::kFloat32), x.grad(), rng, {}, {}};
  for (auto* u : {&a, &b}) {
    for (const auto& p : (*u)->parameters()) r.grads.push_back(p.grad());
    for (const auto& t : (*u)->buffers()) r.buffers.push_back(t.clone());
  }
  return r;
}

void expect_equal(const Run& plain, const Run& ckpt) {
  EXPECT_TRUE(torch::equal(plain.out, ckpt.out));
  EXPECT_TRUE(torch::equal(plain.input_grad, ckpt.input_grad));
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    ASSERT_TRUE(ckpt.grads[i].defined()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(plain.grads[i], ckpt.grads[i])) << "parameter " << i;
  }
  // BatchNorm's running statistics and its batch count, updated once per forward.
  for (size_t i = 0; i < plain.buffers.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.buffers[i], ckpt.buffers[i])) << "buffer " << i;
  }
  // The recompute drew the forward's numbers again and put the generator back.
  EXPECT_TRUE(torch::equal(plain.rng_after, ckpt.rng_after));
}

TEST(ActivationCheckpoint, GradientsEqualThePlainUnitsWithDropoutAndBatchNorm) {
  const auto plain = run(false), ckpt = run(true);
  expect_equal(plain, ckpt);
  // The dropout is live: another draw gives other gradients (a recompute that drew anew would differ).
  EXPECT_FALSE(torch::equal(plain.input_grad, run(false, false, 8).input_grad));
}

TEST(ActivationCheckpoint, GradientsEqualUnderBf16Autocast) { expect_equal(run(false, true), run(true, true)); }

TEST(ActivationCheckpoint, EachParameterHookRunsOnceFromTheOuterBackward) {
  torch::manual_seed(1);
  Unit u;
  dsgd::checkpoint_activations(*u);
  std::vector<int> calls(u->parameters().size(), 0);
  int inside = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    u->parameters()[i].register_hook([&, i](const torch::Tensor& g) {
      ++calls[i];
      inside += dsgd::recomputing_checkpointed_unit() ? 1 : 0;
      return g;
    });
  }
  auto y = dsgd::run_checkpointed(*u, torch::randn({4, 8}), [&](const torch::Tensor& in) { return u->forward(in); });
  y.sum().backward();
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], 1) << "parameter " << i;
  EXPECT_EQ(inside, 0);  // LibTorch 1.13 calls none inside the recompute; 2.x's would be let pass
}

TEST(ActivationCheckpoint, KeepsOnlyTheInput) {
  torch::manual_seed(1);
  Unit u;
  auto x = torch::randn({64, 8}, torch::requires_grad());
  auto forward = [&](const torch::Tensor& in) { return u->forward(in); };
  // Not marked and not asked for by the thread: the unit runs plainly.
  EXPECT_NE(dsgd::run_checkpointed(*u, x, forward).grad_fn()->name(), "dsgd::CheckpointedUnitBackward");
  const bool before = dsgd::set_thread_checkpoint_all(true);
  auto y = dsgd::run_checkpointed(*u, x, forward);
  ASSERT_EQ(y.grad_fn()->name(), "dsgd::CheckpointedUnitBackward");
  // Its edges: the input, then each parameter (the gradients go there, not into a backward of its own).
  EXPECT_EQ(y.grad_fn()->num_outputs(), 1 + u->parameters().size());
  {  // without gradients, nothing to drop
    const torch::NoGradGuard no_grad;
    EXPECT_FALSE(dsgd::run_checkpointed(*u, x, forward).requires_grad());
  }
  dsgd::set_thread_checkpoint_all(before);
  y.sum().backward({}, /*retain_graph=*/true);
  EXPECT_THROW(y.sum().backward(), dsgd::Error);  // recomputed once
}

TEST(ActivationCheckpoint, AModuleNotHeldByASharedPtrIsRefused) {
  UnitImpl on_stack;
  EXPECT_THROW(dsgd::checkpoint_activations(on_stack), dsgd::ConfigError);
}

}  // namespace
