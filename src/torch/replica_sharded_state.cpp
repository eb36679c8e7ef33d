// ReplicaRuntime's optimizer state where it is split (replica.h): over the ps servers (their
// momentum gathered back for a save) or over the replicas (ZeRO stage 1, torch/zero.h: the
// partition, the shares gathered for a save, a loaded state trimmed to this replica's share).
#include "torch/replica.h"

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

void ReplicaRuntime::gather_server_state(bool keep) {
  for (auto& s : syncs_) s->gather_server_state();
  if (!owned_.empty()) gather_optimizer_state(*op_, *syncs_[0]->strategy().sharing(), keep);
}

void ReplicaRuntime::drop_server_state_copy() {
  for (auto& s : syncs_) {
    if (s->updates_on_servers()) s->drop_optimizer_momentum();
  }
  drop_unowned_state(*op_, owned_);
}

}  // namespace dsgd::torch_glue
