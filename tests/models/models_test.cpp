// Reference models: output shapes, exact parameter counts, and name errors.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <chrono>
#include <set>

#include "dsgd/common/error.h"
#include "dsgd/models/gpt.h"
#include "dsgd/models/registry.h"
#include "dsgd/torch/parameter_gate.h"
#include "models/paced_sleep.h"

namespace dsgd::models {
namespace {

TEST(Models, CnnMatchesThePyTorchExample) {
  auto m = make_model("cnn");
  // conv1 320 + conv2 18,496 + fc1 1,179,776 + fc2 1,290.
  EXPECT_EQ(parameter_count(*m), 1199882);
  auto y = m->forward(torch::randn({3, 1, 28, 28}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 10}));
  const auto names = m->named_parameters().keys();
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_EQ(names.back(), "fc2.bias");
}

TEST(Models, MlpDefaultIs784x2048x2048x10) {
  auto m = make_model("mlp");
  EXPECT_EQ(parameter_count(*m), 784 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10);
  EXPECT_EQ(m->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  ModelOptions o;
  o.mlp_hidden = {16};
  EXPECT_EQ(parameter_count(*make_model("mlp", o)), 784 * 16 + 16 + 16 * 10 + 10);
}

TEST(Models, ResNetsMatchTorchvisionParameterCounts) {
  ModelOptions imagenet{.in_channels = 3, .image_size = 224, .num_classes = 1000};
  EXPECT_EQ(parameter_count(*make_model("resnet18", imagenet)), 11689512);
  EXPECT_EQ(parameter_count(*make_model("resnet50", imagenet)), 25557032);
}

TEST(Models, ResNetsRunOnSmallAndLargeImages) {
  for (const auto& name : {"resnet18", "resnet50"}) {
    auto small = make_model(name);  // 1x28x28, small stem
    small->eval();
    EXPECT_EQ(small->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10})) << name;
    auto large = make_model(name, {.in_channels = 3, .image_size = 64, .num_classes = 7});
    large->eval();
    EXPECT_EQ(large->forward(torch::randn({1, 3, 64, 64})).sizes(), (std::vector<int64_t>{1, 7})) << name;
  }
}

TEST(Models, ChannelsLastLaysOutTheConvolutionsAndComputesTheSameValues) {
  for (const auto& name : {"cnn", "resnet18"}) {
    torch::manual_seed(5);
    auto plain = make_model(name, {.dropout = false});
    torch::manual_seed(5);
    auto nhwc = make_model(name, {.dropout = false, .channels_last = true});
    int reordered = 0;  // (a 1-channel or 1x1 kernel is laid out alike either way)
    for (const auto& p : nhwc->parameters()) {
      if (p.dim() != 4) continue;
      EXPECT_TRUE(p.is_contiguous(torch::MemoryFormat::ChannelsLast)) << name;
      if (!p.is_contiguous()) ++reordered;
    }
    EXPECT_GT(reordered, 0) << name;
    plain->eval();
    nhwc->eval();
    const auto x = torch::randn({3, 1, 28, 28});
    EXPECT_TRUE(torch::allclose(plain->forward(x), nhwc->forward(x), 1e-4, 1e-5)) << name;
  }
  try {
    make_model("mlp", {.channels_last = true});
    FAIL() << "channels_last for the MLP was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no convolutions"), std::string::npos) << e.what();
  }
}

TEST(Models, DropoutOffMakesTrainingForwardDeterministic) {
  torch::manual_seed(3);
  auto m = make_model("cnn", {.dropout = false});
  m->train();
  auto x = torch::randn({4, 1, 28, 28});
  EXPECT_TRUE(m->forward(x).equal(m->forward(x)));
  auto with = make_model("cnn");
  with->train();
  EXPECT_FALSE(with->forward(x).equal(with->forward(x)));
}

TEST(Models, SameSeedSameWeights) {
  torch::manual_seed(11);
  auto a = make_model("cnn");
  torch::manual_seed(11);
  auto b = make_model("cnn");
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i]));
}

TEST(Models, SimulatedSleepsAndHandsOutGradientsLastLayerFirst) {
  ModelOptions o{.in_channels = 1, .image_size = 6, .num_classes = 3};
  o.sim_parameters = 1001;
  o.sim_layers = 4;
  o.sim_step_ms = 60;
  auto m = make_model("simulated", o);
  EXPECT_EQ(parameter_count(*m), 1001 + 36 * 3 + 3);  // + the linear head
  std::vector<std::string> order;
  for (const auto& p : m->named_parameters()) {
    if (p.key().rfind("layer", 0) != 0) continue;
    p.value().register_hook([&order, name = p.key()](const torch::Tensor& g) {
      order.push_back(name + ":" + std::to_string(g.numel()));
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  m->forward(torch::randn({2, 1, 6, 6})).sum().backward();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 60);  // slept, forward and backward together
  EXPECT_EQ(order, (std::vector<std::string>{"layer4:250", "layer3:250", "layer2:250", "layer1:251"}));
  for (const auto& p : m->parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_THROW(make_model("simulated", {.sim_parameters = 3, .sim_layers = 4}), ConfigError);
}

// The simulated step keeps to its length when the OS wakes its sleeps late: lateness is taken off
// the next sleeps, up to a cap. A fake clock oversleeps by a set amount.
TEST(Models, PacedSleepTakesLatenessOffTheNextSleeps) {
  std::vector<double> asked;
  double late = 0.3;
  PacedSleep pace([&](double ms) {
    asked.push_back(ms);
    return ms + late;
  });
  pace.sleep(1.0);  // slept 1.3
  pace.sleep(1.0);  // asks 0.7, sleeps 1.0
  ASSERT_EQ(asked.size(), 2U);
  EXPECT_DOUBLE_EQ(asked[0], 1.0);
  EXPECT_DOUBLE_EQ(asked[1], 0.7);
  EXPECT_NEAR(pace.debt_ms(), 0.3, 1e-12);  // the total is 2.3 for 2.0 asked: one lateness, not two

  late = 2.5;  // more than the next sleep: it is skipped, and the debt shrinks by it
  pace.sleep(1.0);  // asks 0.7, sleeps 3.2: debt 0.3 + 3.2 - 1 = 2.5
  pace.sleep(1.0);  // skipped: debt 1.5
  EXPECT_EQ(asked.size(), 3U);
  EXPECT_NEAR(pace.debt_ms(), 1.5, 1e-12);

  late = 100;  // a stall: carried over only up to the cap
  pace.sleep(0.5);  // skipped (debt 1.5 > 0.5): debt 1.0
  pace.sleep(2.0);  // asks 1.0, sleeps 101
  EXPECT_EQ(asked.size(), 4U);
  EXPECT_DOUBLE_EQ(pace.debt_ms(), PacedSleep::kMaxDebtMs);

  late = -0.1;  // early wake-ups never make a later sleep longer than asked
  PacedSleep early([&](double ms) {
    asked.push_back(ms);
    return ms + late;
  });
  early.sleep(1.0);
  early.sleep(1.0);
  EXPECT_DOUBLE_EQ(asked.back(), 1.0);
  EXPECT_DOUBLE_EQ(early.debt_ms(), 0.0);
}

// The forward overlap (dsgd/torch/parameter_gate.h) needs a model to wait for each parameter before
// using it; a model that missed one would be trained without the overlap.
class RecordingGate : public ParameterGate {
 public:
  void wait(const torch::Tensor& p) override { waited.insert(p.unsafeGetTensorImpl()); }
  std::set<const void*> waited;
};

TEST(Models, ForwardWaitsForEveryParameter) {
  ModelOptions small;
  small.sim_parameters = 1000;
  small.sim_layers = 4;
  small.sim_step_ms = 0;
  for (const auto& name : {"cnn", "mlp", "resnet18", "resnet50", "simulated"}) {
    auto m = make_model(name, small);
    RecordingGate gate;
    ParameterGate* previous = set_thread_parameter_gate(&gate);
    m->forward(torch::randn({2, 1, 28, 28}));
    set_thread_parameter_gate(previous);
    for (const auto& p : m->named_parameters()) {
      EXPECT_TRUE(gate.waited.count(p.value().unsafeGetTensorImpl())) << name << ": " << p.key();
    }
  }
  // The GPT names its embeddings, each block and the last norm with the tied output layer (ZeRO
  // stage 3's units).
  auto gpt = make_gpt(gpt_options("gpt-tiny", 256));
  RecordingGate gate;
  ParameterGate* previous = set_thread_parameter_gate(&gate);
  gpt->forward(torch::randint(0, 256, {2, 8}, torch::kInt64));
  set_thread_parameter_gate(previous);
  for (const auto& p : gpt->named_parameters()) {
    EXPECT_TRUE(gate.waited.count(p.value().unsafeGetTensorImpl())) << "gpt-tiny: " << p.key();
  }
  // No gate installed: nothing to wait for.
  wait_for_parameters(*make_model("cnn"));
}

TEST(Models, UnknownNameListsKnownOnes) {
  try {
    make_model("vgg16");
    FAIL() << "unknown model accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "unknown model 'vgg16'; known models: cnn, mlp, resnet18, resnet50, simulated, or a "
                           "TorchScript file (ending in .pt or .pth)");
  }
}

TEST(Models, BadOptionsAreConfigErrors) {
  EXPECT_THROW(make_model("cnn", {.image_size = 4}), ConfigError);
  EXPECT_THROW(make_model("mlp", {.num_classes = 0}), ConfigError);
  EXPECT_THROW(make_model("mlp", {.mlp_hidden = {8, -1}}), ConfigError);
}

}  // namespace
}  // namespace dsgd::models
