// SyncBatchNorm2d (dsgd/torch/sync_batchnorm.h) against one BatchNorm2d over the whole batch: two
// replicas as threads, each with half the batch, their sums met in memory.
#include "dsgd/torch/sync_batchnorm.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>

#include "dsgd/common/error.h"

#include <barrier>
#include <mutex>
#include <thread>
#include <vector>

namespace {

// Two replicas' sums: each deposits its floats, both wait, each takes the sum (in replica order,
// the same on both), both wait again before the next.
class TwoReplicas {
 public:
  class Sums : public dsgd::ReplicaSums {
   public:
    Sums(TwoReplicas& all, int rank, double weight) : all_(all), rank_(rank), weight_(weight) {}
    void sum(float* data, size_t count) override {
      all_.parts_[rank_].assign(data, data + count);
      all_.met_.arrive_and_wait();
      for (size_t i = 0; i < count; ++i) data[i] = all_.parts_[0][i] + all_.parts_[1][i];
      all_.met_.arrive_and_wait();
    }
    double weight() const override { return weight_; }

   private:
    TwoReplicas& all_;
    int rank_;
    double weight_;
  };

 private:
  std::vector<float> parts_[2];
  std::barrier<> met_{2};
};

struct Result {
  torch::Tensor y, grad_x, grad_weight, grad_bias, running_mean, running_var;
};

// Forward and backward of `bn` on x (N, C, H, W) with the loss sum(y * r) / n: what each
// replica computes for its part (n: the global batch, so the parts' losses add up to the whole's).
Result run(dsgd::SyncBatchNorm2d bn, const torch::Tensor& x, const torch::Tensor& r, double n) {
  Result out;
  const torch::Tensor xi = x.clone().requires_grad_(true);
  out.y = bn(xi);
  (out.y * r).sum().div(n).backward();
  out.grad_x = xi.grad();
  out.grad_weight = bn->weight.grad().clone();
  out.grad_bias = bn->bias.grad().clone();
  out.running_mean = bn->running_mean.clone();
  out.running_var = bn->running_var.clone();
  return out;
}

// The largest difference, relative to b's largest magnitude: float32's rounding is ~1e-7 of it;
// a channel whose mean is 50x its spread loses the digits the mean holds when it is taken out,
// in one process's BatchNorm2d as here.
double worst(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

TEST(SyncBatchNorm, TwoReplicasComputeWhatOneBatchNormComputesOnTheWholeBatch) {
  torch::manual_seed(3);
  // A mean far above the spread in some channels: where one pass's E[x^2] - E[x]^2 would cancel.
  const torch::Tensor x = torch::randn({8, 4, 5, 5}) * torch::tensor({1.0, 0.1, 3.0, 0.5}).view({1, 4, 1, 1}) +
                          torch::tensor({0.0, 5.0, -1.0, 5.0}).view({1, 4, 1, 1});
  const torch::Tensor r = torch::randn({8, 4, 5, 5});
  torch::nn::BatchNorm2d whole(4);
  const torch::Tensor xw = x.clone().requires_grad_(true);
  const torch::Tensor yw = whole(xw);
  (yw * r).sum().div(8).backward();

  TwoReplicas two;
  Result part[2];
  dsgd::SyncBatchNorm2d bn[2] = {dsgd::SyncBatchNorm2d(torch::nn::BatchNormOptions(4)),
                                 dsgd::SyncBatchNorm2d(torch::nn::BatchNormOptions(4))};
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      TwoReplicas::Sums sums(two, k, 1.0);
      dsgd::set_thread_replica_sums(&sums);
      part[k] = run(bn[k], x.narrow(0, 4 * k, 4), r.narrow(0, 4 * k, 4), 8);
      dsgd::set_thread_replica_sums(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(worst(torch::cat({part[0].y, part[1].y}), yw), 1e-5);
  EXPECT_LT(worst(torch::cat({part[0].grad_x, part[1].grad_x}), xw.grad()), 1e-5);
  // The parameters' gradients of the parts add up to the whole's (the runtime then averages
  // them, the loss of each part being its own mean).
  EXPECT_LT(worst(part[0].grad_weight + part[1].grad_weight, whole->weight.grad()), 1e-5);
  EXPECT_LT(worst(part[0].grad_bias + part[1].grad_bias, whole->bias.grad()), 1e-5);
  for (int k = 0; k < 2; ++k) {
    EXPECT_LT(worst(part[k].running_mean, whole->running_mean), 1e-5) << "replica " << k;
    EXPECT_LT(worst(part[k].running_var, whole->running_var), 1e-4) << "replica " << k;
  }
  // Uneven parts (3 and 5 of 8): each replica's loss is the mean over its own samples, and the
  // runtime weighs its gradients by its share times the replicas (0.75, 1.25); so weighted,
  // its input's gradient is the whole batch's.
  TwoReplicas uneven;
  const int64_t at[2] = {0, 3}, n[2] = {3, 5};
  const double share[2] = {0.75, 1.25};
  threads.clear();
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      TwoReplicas::Sums sums(uneven, k, share[k]);
      dsgd::set_thread_replica_sums(&sums);
      part[k] = run(dsgd::SyncBatchNorm2d(torch::nn::BatchNormOptions(4)), x.narrow(0, at[k], n[k]),
                    r.narrow(0, at[k], n[k]), static_cast<double>(n[k]));
      dsgd::set_thread_replica_sums(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(worst(torch::cat({part[0].grad_x * (share[0] / 2), part[1].grad_x * (share[1] / 2)}), xw.grad()), 1e-5);
  EXPECT_LT(worst(part[0].grad_weight * (share[0] / 2) + part[1].grad_weight * (share[1] / 2), whole->weight.grad()),
            1e-5);
  // Without the sums each part is normalised by its own statistics: far from the whole's.
  const Result alone = run(dsgd::SyncBatchNorm2d(torch::nn::BatchNormOptions(4)), x.narrow(0, 0, 4),
                           r.narrow(0, 0, 4), 8);
  EXPECT_GT(worst(alone.grad_x, xw.grad().narrow(0, 0, 4)), 1e-3);
}

TEST(SyncBatchNorm, WithoutSyncOrInEvaluationItIsBatchNorm2dUnderTheSameNames) {
  torch::manual_seed(4);
  dsgd::SyncBatchNorm2d plain(torch::nn::BatchNormOptions(3), /*sync=*/false);
  torch::nn::BatchNorm2d reference(3);
  std::vector<std::string> a, b;
  for (const auto& p : plain->named_parameters()) a.push_back(p.key());
  for (const auto& p : plain->named_buffers()) a.push_back(p.key());
  for (const auto& p : reference->named_parameters()) b.push_back(p.key());
  for (const auto& p : reference->named_buffers()) b.push_back(p.key());
  EXPECT_EQ(a, b);
  const torch::Tensor x = torch::randn({6, 3, 4, 4});
  EXPECT_TRUE(torch::equal(plain(x), reference(x)));
  EXPECT_TRUE(torch::equal(plain->running_var, reference->running_var));
  plain->eval();
  reference->eval();
  EXPECT_TRUE(torch::equal(plain(x), reference(x)));
  EXPECT_THROW(plain(torch::randn({6, 3})), dsgd::ConfigError);
}

}  // namespace
