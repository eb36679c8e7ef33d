// ReplicaRuntime's optimizer state where it is split (replica.h): over the ps servers (their
// momentum gathered back for a save) or over the replicas (ZeRO, torch/sync/zero.h: the partition,
// the shares gathered for a save, a loaded state trimmed to this replica's share, stage 2's
// clipping).
#include <cmath>

#include "torch/replica/replica.h"

namespace dsgd::torch_glue {

void ReplicaRuntime::partition_parameters() {
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
  drop_unowned_state(*op_, owned_);  // a state loaded whole keeps only this replica's share
}

double ReplicaRuntime::clip_sharded_gradients(double max_norm) {
  // clip_grad_norm_'s arithmetic to the bit: each trainable parameter's gradient norm, summed
  // over the replicas (only its owner's is not zero, so the sum is exact), then the norm of
  // their stack and one clamped coefficient.
  std::vector<torch::Tensor> owned;
  std::vector<float> norms;
  for (auto& m : op_->models()) {
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

void ReplicaRuntime::gather_server_state(bool keep) {
  for (auto& s : syncs_) {
    if (auto* servers = s->servers()) servers->gather_state();
  }
  if (!owned_.empty()) gather_optimizer_state(*op_, *syncs_[0]->strategy().sharing(), keep);
}

void ReplicaRuntime::drop_server_state_copy() {
  for (auto& s : syncs_) {
    if (auto* servers = s->servers()) servers->drop_optimizer_momentum();
  }
  drop_unowned_state(*op_, owned_);
}

}  // namespace dsgd::torch_glue
