// GradSync against a strategy whose "average" is a known function (x / 2 + 1), so every .grad
// after backward can be checked exactly: over several steps and optimizer steps (from the
// second backward on, .grad is the bucket slot and zero_grad() zeroes it in place), with
// weights, with .grad cleared by the caller or not zeroed, and after Module::load (which set_()s
// the parameters and gives them new AccumulateGrad nodes).
#include "torch/sync/grad_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "dsgd/common/error.h"

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
    launched.push_back(data);
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
  std::vector<const float*> launched;  // each call's data, in call order

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

// A channels_last convolution weight keeps its layout in .grad (the optimizer's multi-tensor
// kernels want the two alike), with the same values as a plain weight's.
TEST(GradSync, AChannelsLastParametersGradKeepsItsLayoutAndValues) {
  torch::manual_seed(3);
  torch::nn::Conv2d plain(torch::nn::Conv2dOptions(2, 4, 3)), nhwc(torch::nn::Conv2dOptions(2, 4, 3));
  {
    torch::NoGradGuard no_grad;
    nhwc->weight.set_data(plain->weight.detach().clone().contiguous(torch::MemoryFormat::ChannelsLast));
    nhwc->bias.copy_(plain->bias);
  }
  const auto x = torch::randn({3, 2, 6, 6});
  plain(x).pow(2).sum().backward();
  auto strategy = std::make_shared<HalfPlusOne>();
  GradSync sync(nhwc->parameters(), /*grad_shard_bytes=*/64, strategy);
  for (int step = 0; step < 2; ++step) {  // the first backward's .grad, then the slot's in place
    for (auto& p : nhwc->parameters()) p.mutable_grad() = step == 0 ? torch::Tensor() : p.grad().zero_();
    nhwc(x.contiguous(torch::MemoryFormat::ChannelsLast)).pow(2).sum().backward();
    const auto& g = nhwc->weight.grad();
    EXPECT_EQ(g.strides(), nhwc->weight.strides()) << "step " << step;
    EXPECT_TRUE(torch::allclose(g, plain->weight.grad() / 2 + 1, 1e-5, 1e-5)) << "step " << step;
    EXPECT_TRUE(torch::allclose(nhwc->bias.grad(), plain->bias.grad() / 2 + 1, 1e-5, 1e-5)) << "step " << step;
  }
}

// HalfPlusOne with memory for gradients of its own (as a host's shared memory would be).
class HalfPlusOneWithBuffer : public HalfPlusOne {
 public:
  explicit HalfPlusOneWithBuffer(size_t floats) : memory(floats, 7.0f) {}
  float* gradient_buffer(size_t count) override {
    requested = count;
    return count <= memory.size() ? memory.data() : nullptr;
  }
  std::vector<float> memory;
  size_t requested = 0;
};

TEST(GradSync, GradientsLiveInTheStrategysBufferAndGradKeepsACopyWhenTheSyncGoes) {
  torch::manual_seed(7);
  Fixture f;
  auto strategy = std::make_shared<HalfPlusOneWithBuffer>(64);
  const auto x = torch::randn({5, 4});
  const auto expected = plain_grads(f, x);
  {
    GradSync sync(f.params(), /*grad_shard_bytes=*/32, strategy);
    EXPECT_EQ(strategy->requested, 4 * 3 + 3 + 3 * 2 + 2);
    for (int inner = 0; inner < 2; ++inner) {
      for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();
      f.loss(x).backward();
      expect_grads(f, expected, 1.0, "inner " + std::to_string(inner));
      for (auto& p : f.params()) {  // every .grad is a view of the strategy's memory: nothing copied back
        const auto* d = p.grad().data_ptr<float>();
        EXPECT_TRUE(d >= strategy->memory.data() && d + p.numel() <= strategy->memory.data() + strategy->memory.size());
      }
    }
    for (const auto& launched : strategy->launched) {
      EXPECT_TRUE(launched >= strategy->memory.data() && launched < strategy->memory.data() + strategy->memory.size());
    }
  }
  std::fill(strategy->memory.begin(), strategy->memory.end(), -1.0f);  // the memory is reused (a new group)
  expect_grads(f, expected, 1.0, "after the GradSync went");
}

TEST(GradSync, AParameterWithoutAGradientContributesZerosFromTheStrategysBufferToo) {
  Fixture f;
  auto strategy = std::make_shared<HalfPlusOneWithBuffer>(64);  // filled with 7s
  GradSync sync(f.params(), 1 << 20, strategy);
  f.a->weight.sum().backward();  // only a.weight gets a gradient
  const auto params = f.params();
  for (size_t i = 1; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].grad(), torch::ones_like(params[i])))  // HalfPlusOne of 0
        << "parameter " << i;
  }
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

// Deferred buckets (forward overlap): their communication overlaps the next forward, whose
// wait_for calls take each bucket's step.
namespace dsgd::torch_glue {
namespace {

struct DeferredFixture : Fixture {
  // 8 floats per bucket: b's bias and weight, a's bias, a's weight (12 floats): 3 buckets.
  static constexpr size_t kShardBytes = 32;
  std::vector<std::vector<size_t>> applied;  // the params of each apply call, in call order
  std::vector<std::vector<torch::Tensor>> applied_grads;
  int begins = 0;
  void attach(GradSync& sync) {
    sync.deferred().set_step({[this] { ++begins; },
                            [this](const std::vector<size_t>& idx, bool finite) {
                              EXPECT_TRUE(finite);
                              applied.push_back(idx);
                              std::vector<torch::Tensor> g;
                              for (size_t i : idx) g.push_back(params()[i].grad().clone());
                              applied_grads.push_back(g);
                            }});
  }
  void wait_all(GradSync& sync) {
    for (size_t i = 0; i < params().size(); ++i) sync.deferred().wait_for(i);
  }
};

std::vector<size_t> counts_of(const std::vector<torch::Tensor>& params) {
  std::vector<size_t> c;
  for (const auto& p : params) c.push_back(static_cast<size_t>(p.numel()));
  return c;
}

TEST(GradSyncDeferred, TheOthersGoInOrderThenTheDeferredFirstLayerFirst) {
  torch::manual_seed(5);
  DeferredFixture f;
  const strategy::BucketPlan plan(counts_of(f.params()), sizeof(float), DeferredFixture::kShardBytes);
  const size_t n = plan.buckets().size();
  ASSERT_EQ(n, 3u);
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, /*deferred=*/1);
  f.attach(sync);
  f.loss(torch::randn({5, 4})).backward();
  ASSERT_EQ(f.strategy->launched.size(), n);
  const float* base = f.strategy->launched[0];  // bucket 0 starts the flat buffer
  std::vector<size_t> order;
  for (const float* d : f.strategy->launched) {
    for (size_t b = 0; b < n; ++b) {
      if (d == base + plan.buckets()[b].offset) order.push_back(b);
    }
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 2, 1}));
  sync.deferred().flush();
}

// The automatic choice changes T between backwards: the launch order follows.
TEST(GradSyncDeferred, ChangingTheDeferredBetweenBackwardsChangesTheOrder) {
  torch::manual_seed(10);
  DeferredFixture f;
  const strategy::BucketPlan plan(counts_of(f.params()), sizeof(float), DeferredFixture::kShardBytes);
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, 0);
  f.attach(sync);
  auto order_of_last_backward = [&] {
    const size_t n = plan.buckets().size();
    const float* base = nullptr;  // bucket 0's data: the lowest address launched
    for (size_t k = f.strategy->launched.size() - n; k < f.strategy->launched.size(); ++k) {
      if (!base || f.strategy->launched[k] < base) base = f.strategy->launched[k];
    }
    std::vector<size_t> order;
    for (size_t k = f.strategy->launched.size() - n; k < f.strategy->launched.size(); ++k) {
      for (size_t b = 0; b < n; ++b) {
        if (f.strategy->launched[k] == base + plan.buckets()[b].offset) order.push_back(b);
      }
    }
    return order;
  };
  f.wait_all(sync);
  f.loss(torch::randn({5, 4})).backward();
  EXPECT_EQ(order_of_last_backward(), (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(f.applied.empty());  // T = 0: nothing deferred, though forward waited
  sync.set_deferred_buckets(2);
  EXPECT_EQ(sync.deferred().count(), 2u);
  f.wait_all(sync);
  f.loss(torch::randn({5, 4})).backward();
  EXPECT_EQ(order_of_last_backward(), (std::vector<size_t>{0, 2, 1}));
  EXPECT_EQ(f.begins, 1);  // deferred
  sync.set_deferred_buckets(99);  // capped at the number of buckets; pending steps stay pending
  EXPECT_EQ(sync.deferred().count(), 3u);
  f.wait_all(sync);  // takes the pending steps
  EXPECT_EQ(f.applied.size(), 3u);
  f.loss(torch::randn({5, 4})).backward();
  EXPECT_EQ(order_of_last_backward(), (std::vector<size_t>{2, 1, 0}));
  sync.deferred().flush();
}

TEST(GradSyncDeferred, AGatedForwardDefersEachBucketsStepToItsWait) {
  torch::manual_seed(6);
  DeferredFixture f;
  const strategy::BucketPlan plan(counts_of(f.params()), sizeof(float), DeferredFixture::kShardBytes);
  // The steps here record gradients and leave the parameters as they are.
  std::vector<torch::Tensor> xs;
  std::vector<std::vector<torch::Tensor>> plain;
  for (int step = 0; step < 3; ++step) {
    xs.push_back(torch::randn({5, 4}));
    plain.push_back(plain_grads(f, xs.back()));
  }
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, 1);
  f.attach(sync);
  for (int step = 0; step < 3; ++step) {
    const auto& x = xs[static_cast<size_t>(step)];
    const auto& expected = plain[static_cast<size_t>(step)];
    f.applied.clear();
    f.applied_grads.clear();
    f.wait_all(sync);  // the forward's waits (nothing pending at the first step)
    f.loss(x).backward();
    for (const auto& p : f.params()) EXPECT_FALSE(p.grad().defined()) << "step " << step;
    EXPECT_TRUE(f.applied.empty()) << "a step was taken before forward asked for it";
    EXPECT_EQ(f.begins, step + 1);
    // Waiting for parameter 0 applies its bucket only, with the strategy's result as .grad.
    sync.deferred().wait_for(0);
    ASSERT_EQ(f.applied.size(), 1u);
    EXPECT_EQ(f.applied[0], plan.buckets()[plan.slot(0).bucket].params);
    sync.deferred().flush();
    EXPECT_EQ(f.applied.size(), plan.buckets().size());
    for (size_t k = 0; k < f.applied.size(); ++k) {
      for (size_t j = 0; j < f.applied[k].size(); ++j) {
        const size_t i = f.applied[k][j];
        EXPECT_TRUE(torch::allclose(f.applied_grads[k][j], expected[i] / 2 + 1, 1e-5, 1e-6))
            << "step " << step << ", parameter " << i;
      }
    }
    for (const auto& p : f.params()) EXPECT_FALSE(p.grad().defined()) << "a step left a .grad behind";
  }
}

TEST(GradSyncDeferred, AForwardThatDoesNotWaitForEveryParameterIsNotDeferred) {
  torch::manual_seed(7);
  DeferredFixture f;
  const auto x = torch::randn({5, 4});
  const auto expected = plain_grads(f, x);
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, 2);
  f.attach(sync);
  for (size_t i = 1; i < f.params().size(); ++i) sync.deferred().wait_for(i);  // parameter 0 left out
  f.loss(x).backward();
  EXPECT_EQ(f.begins, 0);
  EXPECT_TRUE(f.applied.empty());
  expect_grads(f, expected, 1.0, "undeferred backward");
}

TEST(GradSyncDeferred, UsingAParameterWhoseStepIsPendingThrows) {
  torch::manual_seed(8);
  DeferredFixture f;
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, 2);
  f.attach(sync);
  f.wait_all(sync);
  f.loss(torch::randn({5, 4})).backward();
  ASSERT_EQ(f.begins, 1);
  // The next forward skips its waits: its backward would average a stale model's gradient.
  try {
    f.loss(torch::randn({5, 4})).backward();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("wait_for_parameters"), std::string::npos) << e.what();
  }
  // That backward never finished: the next one fails as well rather than average out of step.
  f.wait_all(sync);
  EXPECT_THROW(f.loss(torch::randn({5, 4})).backward(), std::exception);
}

// Profiles: a deferred step's time is the optimizer's, its wait is communication's, and neither
// lands in backward's wait. Each step here sleeps 10 ms.
TEST(GradSyncDeferred, TimesSplitDeferredStepsFromBackwardsWait) {
  torch::manual_seed(9);
  DeferredFixture f;
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, 2);
  sync.deferred().set_step({[] {}, [](const std::vector<size_t>&, bool) {
                            std::this_thread::sleep_for(std::chrono::milliseconds(10));
                          }});
  sync.take_times();
  // Not deferred (no waits in forward): backward waits for every bucket, no step is deferred.
  f.loss(torch::randn({5, 4})).backward();
  auto t = sync.take_times();
  EXPECT_GT(t.wait_s, 0.0);
  EXPECT_EQ(t.deferred_wait_s, 0.0);
  EXPECT_EQ(t.deferred_step_s, 0.0);
  // Deferred: backward waits for nothing; the three buckets' steps (30 ms) come at the flush.
  f.wait_all(sync);
  f.loss(torch::randn({5, 4})).backward();
  t = sync.take_times();
  EXPECT_EQ(t.wait_s, 0.0);
  sync.deferred().flush();
  t = sync.take_times();
  EXPECT_GE(t.deferred_step_s, 0.03);
  EXPECT_EQ(t.wait_s, t.deferred_wait_s);  // all of it for deferred steps
  EXPECT_LT(t.wait_s, t.deferred_step_s);  // the steps' sleeps are not waits
  t = sync.take_times();                   // taking resets
  EXPECT_EQ(t.wait_s + t.deferred_wait_s + t.deferred_step_s, 0.0);
}

}  // namespace
}  // namespace dsgd::torch_glue

// The check as the hooks copy: what fails it on one replica reaches the others through the
// bucket's first element, which the failing replica sends as NaN.
namespace dsgd::torch_glue {
namespace {

// The average of this replica's part and another replica's that failed the check in call
// `poisoned` (counted from 0): that bucket comes back with a NaN first element.
class OtherReplicaFails : public strategy::GradientStrategy {
 public:
  explicit OtherReplicaFails(int poisoned) : poisoned_(poisoned) {}
  std::string name() const override { return "other-replica-fails"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    if (calls_++ == poisoned_ && count > 0) data[0] = std::nanf("");
    auto w = std::make_shared<comm::Work>("test bucket");
    w->complete();
    return w;
  }
  void abort(const std::string&) override {}

 private:
  const int poisoned_;
  int calls_ = 0;
};

TEST(GradSyncCheck, AGradientTooLargeToSumSafelyCountsAsNonFinite) {
  Fixture f;
  GradSync sync(f.params(), 1 << 20, f.strategy);
  const auto x = torch::randn({5, 4});
  (f.loss(x) + (f.a->weight * 1e34f).sum()).backward();  // a.weight's gradient about 1e34 > 2^111
  EXPECT_FALSE(sync.last_finite());
  for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();
  (f.loss(x) + (f.a->weight * 1e32f).sum()).backward();  // large, but below the limit
  EXPECT_TRUE(sync.last_finite());
}

TEST(GradSyncCheck, AnotherReplicasFailureIsSeenHere) {
  Fixture f;
  auto other = std::make_shared<OtherReplicaFails>(/*poisoned=*/1);
  GradSync sync(f.params(), /*grad_shard_bytes=*/32, other);  // 3 buckets
  f.loss(torch::randn({5, 4})).backward();  // finite here
  EXPECT_FALSE(sync.last_finite());
  for (auto& p : f.params()) p.mutable_grad() = torch::Tensor();
  f.loss(torch::randn({5, 4})).backward();  // calls 3..5: nobody failed
  EXPECT_TRUE(sync.last_finite());
}

// Every average fails at once, as in a group aborted when a peer is lost.
class AbortedGroup : public strategy::GradientStrategy {
 public:
  std::string name() const override { return "aborted"; }
  std::shared_ptr<comm::Work> average_async(float*, size_t) override {
    ++calls;
    auto w = std::make_shared<comm::Work>("test bucket");
    w->complete(std::make_exception_ptr(CommError("group aborted (a peer was lost)", "test bucket")));
    return w;
  }
  void abort(const std::string&) override {}
  int calls = 0;
};

// The backward ends at the next gradient after the first failed average, not at its end: a
// survivor of a lost peer answers the recovery at once, without computing the rest of a
// backward (seconds on a large model) for nothing. Broken (no check in the hook), every
// bucket is launched and the first layer's gradient computed.
TEST(GradSyncCheck, ABackwardEndsAtTheFirstFailedAverage) {
  torch::manual_seed(13);
  torch::nn::Sequential net;
  for (int i = 0; i < 6; ++i) net->push_back(torch::nn::Linear(8, 8));
  auto group = std::make_shared<AbortedGroup>();
  int first_layer_grads = 0;  // the last gradient backward computes
  net->parameters().front().register_hook([&](const torch::Tensor&) { ++first_layer_grads; });
  {
    GradSync sync(net->parameters(), /*grad_shard_bytes=*/256, group);  // a layer's weight fills a bucket
    EXPECT_THROW(net->forward(torch::randn({3, 8})).pow(2).sum().backward(), CommError);
    EXPECT_LE(group->calls, 2) << "buckets launched after the first failed";
    EXPECT_EQ(first_layer_grads, 0);
    EXPECT_THROW(net->forward(torch::randn({3, 8})).sum().backward(), Error);  // the sync stays failed
  }
}

// Deferred steps: each bucket's step gets its own bucket's answer. NaN in a's weight only
// (param 0, a bucket of its own) marks that bucket's step alone.
TEST(GradSyncCheck, EachDeferredStepGetsItsOwnBucketsAnswer) {
  torch::manual_seed(12);
  DeferredFixture f;
  GradSync sync(f.params(), DeferredFixture::kShardBytes, f.strategy, true, /*deferred=*/1);
  std::vector<std::pair<std::vector<size_t>, bool>> applied;
  sync.deferred().set_step(
      {[] {}, [&](const std::vector<size_t>& idx, bool finite) { applied.emplace_back(idx, finite); }});
  const auto nan = torch::full({3, 4}, std::nanf(""));
  for (int step = 0; step < 2; ++step) {
    f.wait_all(sync);  // takes the last step's pending steps
    auto loss = f.loss(torch::randn({5, 4}));
    if (step == 0) loss = loss + (f.a->weight * nan).sum();
    loss.backward();
  }
  sync.deferred().flush();
  ASSERT_EQ(applied.size(), 6u);  // 3 buckets, 2 steps
  for (size_t k = 0; k < applied.size(); ++k) {
    const auto& idx = applied[k].first;
    const bool has_a_weight = std::find(idx.begin(), idx.end(), size_t{0}) != idx.end();
    EXPECT_EQ(applied[k].second, k >= 3 || !has_a_weight) << "apply " << k;
  }
}

}  // namespace
}  // namespace dsgd::torch_glue
