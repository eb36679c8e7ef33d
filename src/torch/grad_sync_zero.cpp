// GradSync's part in ZeRO stage 1 (grad_sync.h, torch/zero.h): which parameters this replica
// steps, and the parameters shared after the step through the flat buffer.
#include <torch/utils.h>

#include "comm/timeline.h"
#include "dsgd/error.h"
#include "torch/grad_sync.h"

namespace dsgd::torch_glue {

void GradSync::set_owned(std::vector<bool> owned) {
  if (owned.size() != params_.size()) throw Error("GradSync::set_owned: one flag per parameter expected");
  if (strategy_->sharing() == nullptr) {
    throw ConfigError("step.zero_stage needs a strategy whose replicas can share parameters (allreduce), not " +
                          strategy_->name(),
                      "step.zero_stage");
  }
  owned_ = std::move(owned);
}

void GradSync::release_unowned_grads() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owns(i)) params_[i].mutable_grad() = torch::Tensor();
  }
}

void GradSync::share_parameters() {
  if (owned_.empty()) return;
  comm::timeline::Span span("share parameters");
  torch::NoGradGuard no_grad;
  auto* sharing = strategy_->sharing();
  const auto& buckets = plan_.buckets();
  std::vector<std::shared_ptr<comm::Work>> works;
  works.reserve(buckets.size());
  for (const auto& b : buckets) {  // packed and launched one by one: packing overlaps the sums in flight
    for (size_t i : b.params) {
      if (owned_[i]) {
        slots_[i].copy_(params_[i]);
      } else {
        slots_[i].zero_();
      }
    }
    // On CUDA the sum runs on the host copy: a blocking copy (the packing kernels done first).
    if (staged_) host_.narrow(0, b.offset, b.count).copy_(flat_.narrow(0, b.offset, b.count));
    works.push_back(sharing->sum_async(host_.data_ptr<float>() + b.offset, b.count));
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    const auto& b = buckets[k];
    works[k]->wait();
    // In the device's queue, before the copies out of the slots below.
    if (staged_) flat_.narrow(0, b.offset, b.count).copy_(host_.narrow(0, b.offset, b.count), /*non_blocking=*/true);
    for (size_t i : b.params) {
      if (!owned_[i]) params_[i].copy_(slots_[i]);
    }
  }
}

}  // namespace dsgd::torch_glue
