// GradSync under ZeRO stage 2 (a ring of bucket buffers, grad_sync.h) against a strategy whose
// "average" is a known function (x / 2 + 1) and whose "sum over replicas" is the identity (one
// replica standing for all): every owned .grad is checked exactly, the others must be gone.
// The parameters are handed over in an order backward does not follow, and the ring is one or
// two buffers, so that gradients wait aside for their buffer and take it back from later
// buckets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "torch/sync/grad_sync.h"

namespace dsgd::torch_glue {
namespace {

class HalfPlusOneSharing : public strategy::GradientStrategy, public strategy::Sharing {
 public:
  explicit HalfPlusOneSharing(size_t floats) : memory(floats, 7.0f) {}
  ~HalfPlusOneSharing() override {
    for (auto& t : threads_) t.join();
  }
  std::string name() const override { return "half-plus-one"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    ++calls;
    auto w = std::make_shared<comm::Work>("test bucket");
    threads_.emplace_back([data, count, w] {  // a little later than asked, on its own thread
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (size_t i = 0; i < count; ++i) data[i] = data[i] / 2 + 1;
      w->complete();
    });
    return w;
  }
  void abort(const std::string&) override {}
  float* gradient_buffer(size_t count) override {
    requested = count;
    return count <= memory.size() ? memory.data() : nullptr;
  }
  Sharing* sharing() override { return this; }
  std::shared_ptr<comm::Work> sum_async(float*, size_t) override {
    auto w = std::make_shared<comm::Work>("test sum");
    w->complete();
    return w;
  }
  void broadcast(void*, size_t, int) override {}
  int rank() const override { return 0; }
  int size() const override { return 2; }

  int calls = 0;
  std::vector<float> memory;
  size_t requested = 0;

 private:
  std::vector<std::thread> threads_;
};

struct Model {
  torch::nn::Linear a{4, 3}, b{3, 2};
  // b's before a's: the plan packs the last-registered first (a's in buckets 0, 1), but backward
  // gives b's gradients first.
  std::vector<torch::Tensor> params() {
    auto p = b->parameters();
    for (auto& q : a->parameters()) p.push_back(q);
    return p;
  }
  torch::Tensor loss(const torch::Tensor& x) { return b(torch::relu(a(x))).pow(2).sum(); }
  std::vector<torch::Tensor> plain_grads(const torch::Tensor& x) {
    for (auto& p : params()) p.mutable_grad() = torch::Tensor();
    loss(x).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : params()) g.push_back(p.grad().clone());
    for (auto& p : params()) p.mutable_grad() = torch::Tensor();
    return g;
  }
};

const std::vector<bool> kOwned{true, false, false, true};  // b.weight, a.bias

TEST(GradSyncRing, OwnedGradientsAreTheAveragesAndTheOthersAreGoneWhateverTheRing) {
  for (size_t ring : {1, 2}) {
    SCOPED_TRACE("ring " + std::to_string(ring));
    torch::manual_seed(1);
    Model m;
    const auto x = torch::randn({5, 4});
    const auto plain = m.plain_grads(x);
    auto strategy = std::make_shared<HalfPlusOneSharing>(64);
    // 8-byte buckets: every parameter its own (b.bias 2 floats shares with nothing).
    GradSync sync(m.params(), /*grad_shard_bytes=*/8, strategy, true, 0, ring);
    EXPECT_TRUE(sync.ring());
    sync.set_owned(kOwned);
    EXPECT_EQ(strategy->requested, ring_elements({6, 2, 12, 3}, 8, ring));
    EXPECT_LT(strategy->requested, 6u + 2 + 12 + 3);
    sync.set_weight(3.0);
    for (int step = 0; step < 3; ++step) {
      m.loss(x).backward();
      EXPECT_TRUE(sync.last_finite());
      const auto params = m.params();
      for (size_t i = 0; i < params.size(); ++i) {
        if (kOwned[i]) {
          ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i;
          EXPECT_TRUE(torch::allclose(params[i].grad(), plain[i] * 3.0 / 2 + 1, 1e-5, 1e-6))
              << "step " << step << ", parameter " << i;
        } else {
          EXPECT_FALSE(params[i].grad().defined()) << "step " << step << ", parameter " << i;
        }
      }
      EXPECT_EQ(strategy->calls, 4 * (step + 1)) << "one average per bucket and backward";
    }
    EXPECT_EQ(sync.gradient_bytes(), (ring_elements({6, 2, 12, 3}, 8, ring) + 6 + 3) * sizeof(float));
  }
}

// Accumulating under stage 2 averages each micro-batch and sums the owned averages: two
// micro-batches give f(w g1) + f(w g2), f the strategy's function.
TEST(GradSyncRing, AccumulatedMicroBatchesSumTheirAverages) {
  torch::manual_seed(2);
  Model m;
  const auto x1 = torch::randn({5, 4}), x2 = torch::randn({5, 4});
  const auto g1 = m.plain_grads(x1), g2 = m.plain_grads(x2);
  auto strategy = std::make_shared<HalfPlusOneSharing>(64);
  GradSync sync(m.params(), 8, strategy, true, 0, 1);
  sync.set_owned(kOwned);
  for (int step = 0; step < 2; ++step) {
    sync.set_micro_batch(true, false);
    m.loss(x1).backward();
    for (const auto& p : m.params()) EXPECT_FALSE(p.grad().defined()) << "a held micro-batch sets no .grad";
    sync.set_micro_batch(false, true);
    m.loss(x2).backward();
    EXPECT_TRUE(sync.last_finite());
    const auto params = m.params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!kOwned[i]) continue;
      EXPECT_TRUE(torch::allclose(params[i].grad(), (g1[i] / 2 + 1) + (g2[i] / 2 + 1), 1e-5, 1e-6))
          << "step " << step << ", parameter " << i;
    }
  }
}

// After the step each replica's owned parameters go to all through the ring's buffers, one
// bucket after another: with the identity for a sum, the others' parameters become the zeros
// this replica put in their place, and its own stay.
TEST(GradSyncRing, ParametersAreSharedThroughTheRing) {
  torch::manual_seed(3);
  Model m;
  auto strategy = std::make_shared<HalfPlusOneSharing>(64);
  GradSync sync(m.params(), 8, strategy, true, 0, 2);
  sync.set_owned(kOwned);
  std::vector<torch::Tensor> before;
  for (const auto& p : m.params()) before.push_back(p.detach().clone());
  sync.share_parameters();
  const auto params = m.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (kOwned[i]) {
      EXPECT_TRUE(torch::equal(params[i], before[i])) << "parameter " << i;
    } else {
      EXPECT_TRUE(torch::equal(params[i], torch::zeros_like(params[i]))) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace dsgd::torch_glue
