// A replica's share under step.zero_stage (torch/replica/zero_share.h).
#include "torch/replica/zero_share.h"

#include <cmath>

namespace dsgd::torch_glue {

void ZeroShare::partition() {
  owned_ = {};
  share_after_step_ = false;
  if (options_.step.zero_stage == 0 || options_.info.world_size < 2 || syncs_.empty()) return;
  std::vector<int64_t> numels;
  for (const auto& s : syncs_) {
    for (size_t i = 0; i < s->num_params(); ++i) numels.push_back(s->param(i).numel());
  }
  const auto owner = partition_by_size(numels, options_.info.world_size);
  size_t k = 0;
  for (auto& s : syncs_) {
    std::vector<bool> mine(s->num_params());
    for (size_t i = 0; i < mine.size(); ++i, ++k) {
      mine[i] = owner[k] == options_.info.rank;
      const void* impl = s->param(i).unsafeGetTensorImpl();
      owned_.sharded.insert(impl);
      if (mine[i]) owned_.owned.insert(impl);
    }
    s->set_owned(std::move(mine));
  }
  drop_unowned();  // a state loaded whole keeps only this replica's share
}

size_t ZeroShare::ring_buckets(int world_size) const {
  return options_.step.zero_stage == 2 && world_size >= 2 ? kRingBuckets : 0;
}

void ZeroShare::before_step() {
  if (!active()) return;
  for (auto& s : syncs_) s->release_unowned_grads();
  share_after_step_ = true;
}

void ZeroShare::after_step() {
  if (!share_after_step_) return;
  for (auto& s : syncs_) s->share_parameters();
  share_after_step_ = false;
}

double ZeroShare::clip(double max_norm) {
  // clip_grad_norm_'s arithmetic to the bit: each trainable parameter's gradient norm, summed
  // over the replicas (only its owner's is not zero, so the sum is exact), then the norm of
  // their stack and one clamped coefficient.
  std::vector<torch::Tensor> owned;
  std::vector<float> norms;
  for (auto& m : op_.models()) {
    for (auto& p : m->parameters()) {
      if (!p.requires_grad()) continue;
      const bool mine = owned_.owns(p) && p.grad().defined();
      norms.push_back(mine ? p.grad().norm(2).item<float>() : 0.0f);
      if (mine) owned.push_back(p);
    }
  }
  if (norms.empty()) return 0;
  syncs_[0]->strategy().sharing()->sum_async(norms.data(), norms.size())->wait();
  const auto stacked = torch::from_blob(norms.data(), {static_cast<int64_t>(norms.size())}, torch::kFloat32);
  const auto total = norms.size() == 1 ? stacked[0].clone() : stacked.norm(2);
  const auto coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (auto& p : owned) p.mutable_grad().mul_(coef);
  return total.item<double>();
}

void ZeroShare::gather_state(bool keep) {
  if (active()) gather_optimizer_state(op_, *syncs_[0]->strategy().sharing(), keep);
}

}  // namespace dsgd::torch_glue
