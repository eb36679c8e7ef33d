// dsgd/torch/sync_batchnorm.h — BatchNorm over the global batch (PyTorch's SyncBatchNorm): in training,
// each channel's mean and variance are those of every replica's samples together, so a job of
// N replicas normalises, trains and updates its running statistics as one process with the
// global batch does. Plain BatchNorm normalises each replica's part by its own statistics.
//
//   auto bn = register_module("bn1", dsgd::SyncBatchNorm2d(torch::nn::BatchNormOptions(64)));
//   x = bn(x);   // [N, C, H, W]
//
// Its parameters and buffers are BatchNorm2d's (weight, bias, running_mean, running_var,
// num_batches_tracked), under the same names, so checkpoints and model.pt read the same. Each
// training forward sums C + 1 floats over the replicas (the mean), then C (the squared deviations
// from it), and its backward as many, through the job's strategy (synchronous ones: allreduce,
// simple, ps); outside a replica's training (one process, evaluation) the sums are this
// process's own. With `sync` false it is BatchNorm2d.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstddef>

namespace dsgd {

class SyncBatchNorm2dImpl : public torch::nn::Cloneable<SyncBatchNorm2dImpl> {
 public:
  explicit SyncBatchNorm2dImpl(const torch::nn::BatchNormOptions& options, bool sync = true);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);

  torch::nn::BatchNormOptions options;
  bool sync = true;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  torch::Tensor synced_forward(const torch::Tensor& input);
};
TORCH_MODULE(SyncBatchNorm2d);

// `t` summed over the replicas of the calling thread's job (itself where there is none), as an
// autograd operation: its gradient is the replicas' gradients summed alike, each first weighted
// by its replica's share of the global batch.
torch::Tensor sum_over_replicas(const torch::Tensor& t);

// ---- for the runtime: where the calling thread's sums go ----
class ReplicaSums {
 public:
  virtual ~ReplicaSums() = default;
  // Replaces data[0..count) with its sum over the replicas.
  virtual void sum(float* data, size_t count) = 0;
  // This replica's share of the global batch times the number of replicas (1 when even).
  virtual double weight() const = 0;
};
// Installs `sums` (null: none) for the calling thread; returns the one it replaces.
ReplicaSums* set_thread_replica_sums(ReplicaSums* sums);

}  // namespace dsgd
