#include "dsgd/torch/sync_batchnorm.h"

#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>

#include <string>
#include <utility>
#include <vector>

#include "dsgd/common/error.h"

namespace dsgd {
namespace {

thread_local ReplicaSums* t_sums = nullptr;

// `t` (float32) summed over the replicas where the calling thread has some; on the host, where
// the strategies read, and back to t's device.
torch::Tensor summed(const torch::Tensor& t, double weight) {
  torch::Tensor host = t.detach().to(torch::kCPU, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true).contiguous();
  if (weight != 1.0) host.mul_(weight);
  t_sums->sum(host.data_ptr<float>(), static_cast<size_t>(host.numel()));
  if (weight != 1.0) host.div_(weight);
  return host.to(t.device(), t.scalar_type());
}

// The sum over the replicas as an autograd operation. Each replica's output is every replica's
// inputs summed, so the gradient reaching one replica's input is every replica's output
// gradient summed; each replica's gradients are of its own loss, which the runtime weighs by its
// share of the batch when it averages the parameters' gradients, so the sum weighs them alike
// and this replica's share is taken back out of it.
class SumOverReplicas : public torch::autograd::Function<SumOverReplicas> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& t) {
    return t_sums != nullptr ? summed(t, 1.0) : t.detach().clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {t_sums != nullptr ? summed(grads[0], t_sums->weight()) : grads[0]};
  }
};

}  // namespace

ReplicaSums* set_thread_replica_sums(ReplicaSums* sums) {
  std::swap(t_sums, sums);
  return sums;
}

torch::Tensor sum_over_replicas(const torch::Tensor& t) { return SumOverReplicas::apply(t); }

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(const torch::nn::BatchNormOptions& o, bool s) : options(o), sync(s) {
  reset();
}

// BatchNorm2d's parameters and buffers, by the same names and with the same first values.
void SyncBatchNorm2dImpl::reset() {
  const int64_t c = options.num_features();
  weight = register_parameter("weight", options.affine() ? torch::ones({c}) : torch::Tensor(), options.affine());
  bias = register_parameter("bias", options.affine() ? torch::zeros({c}) : torch::Tensor(), options.affine());
  const bool track = options.track_running_stats();
  running_mean = register_buffer("running_mean", track ? torch::zeros({c}) : torch::Tensor());
  running_var = register_buffer("running_var", track ? torch::ones({c}) : torch::Tensor());
  num_batches_tracked =
      register_buffer("num_batches_tracked", track ? torch::tensor(0, torch::kLong) : torch::Tensor());
}

torch::Tensor SyncBatchNorm2dImpl::forward(const torch::Tensor& input) {
  if (input.dim() != 4) {
    throw ConfigError("SyncBatchNorm2d expects [N, C, H, W] input, got " + std::to_string(input.dim()) +
                      " dimension(s)");
  }
  if (sync && is_training()) return synced_forward(input);
  // BatchNorm2d's forward, as LibTorch writes it.
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias,
                                                   is_training() || !options.track_running_stats(), factor,
                                                   options.eps());
}

torch::Tensor SyncBatchNorm2dImpl::synced_forward(const torch::Tensor& input) {
  const int64_t c = input.size(1);
  const torch::Tensor x = input.to(torch::kFloat32);
  const std::vector<int64_t> dims = {0, 2, 3};
  const auto channels = [c](const torch::Tensor& t) { return t.view({1, c, 1, 1}); };
  // Two passes, each one sum over the replicas: the mean (with the samples' count), then the
  // squared deviations from it. E[x^2] - E[x]^2 from one pass would cancel to noise in channels
  // whose mean dwarfs their spread, and part from one process's result by far more than rounding.
  const double local_count = static_cast<double>(input.numel() / std::max<int64_t>(1, c));
  const torch::Tensor first = sum_over_replicas(torch::cat({x.sum(dims), torch::full({1}, local_count, x.options())}));
  const torch::Tensor count = first.narrow(0, c, 1).detach();
  const torch::Tensor mean = first.narrow(0, 0, c) / count;
  const torch::Tensor centred = x - channels(mean);
  const torch::Tensor var = sum_over_replicas((centred * centred).sum(dims)) / count;  // biased, as normalising uses
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    const double m = options.momentum().value_or(1.0 / num_batches_tracked.item<double>());
    const double n = count.item<double>();
    running_mean.mul_(1 - m).add_(mean.detach().to(running_mean.dtype()), m);
    running_var.mul_(1 - m).add_((var.detach() * (n / std::max(1.0, n - 1))).to(running_var.dtype()), m);
  }
  torch::Tensor y = centred * channels(torch::rsqrt(var + options.eps()));
  if (options.affine()) y = y * channels(weight) + channels(bias);
  return y.to(input.scalar_type());
}

}  // namespace dsgd
