// GradSync under ZeRO stage 2 (a ring of bucket buffers, grad_sync.h) against a strategy whose
// reduce-scatter is a known function of a replica's own block (x / 2 + 1) and whose allgather
// fills the other replica's blocks with a known value: every piece's average is checked exactly,
// on either replica of two, and no parameter may keep a gradient. The parameters are handed over
// in an order backward does not follow, and the ring is one or two buffers, so that gradients
// wait aside for their buffer and take it back from later buckets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "dsgd/common/error.h"
#include "torch/sync/grad_sync.h"

namespace dsgd::torch_glue {
namespace {

// Stands for replica `rank` of 2: its reduce-scatter gives f(x) = x / 2 + 1 of its own block
// (a little later than asked, on its own thread), its allgather keeps its own block and fills the
// other replica's with -3.
class HalfPlusOneSharing : public strategy::GradientStrategy, public strategy::Sharing {
 public:
  HalfPlusOneSharing(size_t floats, int rank) : memory(floats, 7.0f), rank_(rank) {}
  ~HalfPlusOneSharing() override {
    for (auto& t : threads_) t.join();
  }
  std::string name() const override { return "half-plus-one"; }
  std::shared_ptr<comm::Work> average_async(float*, size_t) override { throw Error("ZeRO reduce-scatters"); }
  void abort(const std::string&) override {}
  float* gradient_buffer(size_t count) override {
    requested = count;
    return count <= memory.size() ? memory.data() : nullptr;
  }
  Sharing* sharing() override { return this; }
  std::shared_ptr<comm::Work> sum_async(float*, size_t) override { throw Error("not used"); }
  std::shared_ptr<comm::Work> reduce_scatter_async(const float* in, float* out, size_t block) override {
    ++calls;
    auto w = std::make_shared<comm::Work>("test bucket");
    threads_.emplace_back([in = in + static_cast<size_t>(rank_) * block, out, block, w] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (size_t i = 0; i < block; ++i) out[i] = in[i] / 2 + 1;
      w->complete();
    });
    return w;
  }
  std::shared_ptr<comm::Work> allgather_async(const float* in, float* out, size_t block) override {
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < block; ++i) out[static_cast<size_t>(r) * block + i] = r == rank_ ? in[i] : -3.0f;
    }
    auto w = std::make_shared<comm::Work>("test gather");
    w->complete();
    return w;
  }
  void broadcast(void*, size_t, int) override {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }

  int calls = 0;
  std::vector<float> memory;
  size_t requested = 0;

 private:
  const int rank_;
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

// Piece i's part of a whole parameter-shaped tensor (the parameters here are contiguous).
torch::Tensor part(const torch::Tensor& whole, const GradSync& sync, size_t i) {
  const auto& p = sync.shards().piece(i);
  return whole.reshape({-1}).narrow(0, static_cast<int64_t>(p.begin), static_cast<int64_t>(p.count));
}

TEST(GradSyncRing, EachReplicaGetsTheAveragesOfItsPiecesAndNoParameterKeepsAGradient) {
  for (int rank : {0, 1}) {
    for (size_t ring : {1, 2}) {
      SCOPED_TRACE("replica " + std::to_string(rank) + ", ring " + std::to_string(ring));
      torch::manual_seed(1);
      Model m;
      const auto x = torch::randn({5, 4});
      const auto plain = m.plain_grads(x);
      auto strategy = std::make_shared<HalfPlusOneSharing>(64, rank);
      // 8-byte buckets: every parameter its own (b.bias 2 floats shares with nothing).
      GradSync sync(m.params(), /*grad_shard_bytes=*/8, strategy, true, 0, ring, /*shards=*/2);
      EXPECT_TRUE(sync.ring());
      EXPECT_EQ(strategy->requested, ring_elements({6, 2, 12, 3}, 8, ring, 2));
      EXPECT_LT(strategy->requested, 6u + 2 + 12 + 3);
      sync.set_weight(3.0);
      size_t pieces = 0;
      for (int step = 0; step < 3; ++step) {
        m.loss(x).backward();
        EXPECT_TRUE(sync.last_finite());
        const auto params = m.params();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_FALSE(params[i].grad().defined()) << "step " << step << ", parameter " << i;
          if (sync.shards().piece(i).count == 0) continue;
          pieces += step == 0;
          EXPECT_TRUE(torch::allclose(sync.piece_grad(i), part(plain[i], sync, i) * 3.0 / 2 + 1, 1e-5, 1e-6))
              << "step " << step << ", parameter " << i;
        }
        EXPECT_EQ(strategy->calls, 4 * (step + 1)) << "one reduce-scatter per bucket and backward";
      }
      EXPECT_EQ(pieces, 4u);  // a piece of each (its blocks of 2 + 6 + 1 + 3 floats: a.bias, a.weight, b.*)
      // The ring (padded), and the shard of 12 floats.
      EXPECT_EQ(sync.gradient_bytes(), (ring_elements({6, 2, 12, 3}, 8, ring, 2) + 12) * sizeof(float));
    }
  }
}

// Accumulating under stage 2 reduces each micro-batch and sums the averages in the block: two
// micro-batches give f(w g1) + f(w g2), f the strategy's function.
TEST(GradSyncRing, AccumulatedMicroBatchesSumTheirAverages) {
  torch::manual_seed(2);
  Model m;
  const auto x1 = torch::randn({5, 4}), x2 = torch::randn({5, 4});
  const auto g1 = m.plain_grads(x1), g2 = m.plain_grads(x2);
  auto strategy = std::make_shared<HalfPlusOneSharing>(64, 1);
  GradSync sync(m.params(), 8, strategy, true, 0, 1, 2);
  for (int step = 0; step < 2; ++step) {
    sync.set_micro_batch(true, false);
    m.loss(x1).backward();
    for (const auto& p : m.params()) EXPECT_FALSE(p.grad().defined()) << "a held micro-batch sets no .grad";
    sync.set_micro_batch(false, true);
    m.loss(x2).backward();
    EXPECT_TRUE(sync.last_finite());
    for (size_t i = 0; i < m.params().size(); ++i) {
      if (sync.shards().piece(i).count == 0) continue;
      EXPECT_TRUE(torch::allclose(sync.piece_grad(i), (part(g1[i], sync, i) / 2 + 1) + (part(g2[i], sync, i) / 2 + 1),
                                  1e-5, 1e-6))
          << "step " << step << ", parameter " << i;
    }
  }
}

// After the step each replica's pieces go to all through the ring's buffers, one bucket after
// another: the other replica's elements become what it sent (-3 here), this one's stay.
TEST(GradSyncRing, ParametersAreGatheredThroughTheRing) {
  torch::manual_seed(3);
  Model m;
  auto strategy = std::make_shared<HalfPlusOneSharing>(64, 0);
  GradSync sync(m.params(), 8, strategy, true, 0, 2, 2);
  std::vector<torch::Tensor> before;
  for (const auto& p : m.params()) before.push_back(p.detach().clone());
  sync.share_parameters();
  const auto params = m.params();
  for (size_t i = 0; i < params.size(); ++i) {
    auto expected = torch::full_like(before[i], -3.0f);
    const auto& p = sync.shards().piece(i);
    if (p.count > 0) part(expected, sync, i).copy_(part(before[i], sync, i));
    EXPECT_TRUE(torch::equal(params[i], expected)) << "parameter " << i;
  }
}

}  // namespace
}  // namespace dsgd::torch_glue
