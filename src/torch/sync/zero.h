// ZeRO stage 1 (StepConfig::zero_stage): the optimizer state sharded over the replicas. Each
// trainable parameter is owned by one replica, which alone keeps optimizer state for it and steps
// it; GradSync (grad_sync.h) clears the other parameters' .grad before the operator's
// optimizer.step(), so any LibTorch optimizer skips them and makes no state for them, and shares
// the updated parameters after the step. What is here: the partition, and the optimizer state as
// checkpoints need it, whole.
//
//   auto owner = partition_by_size(numels, world_size);         // the same on every replica
//   OwnedSet owned = ...;                                         // parameters owner == rank
//   drop_unowned_state(op, owned);                                // after loading a whole state
//   gather_optimizer_state(op, owned, sharing, /*keep=*/true);    // collective, before save_state
//
// Whole tensors, not flat slices: a LibTorch optimizer keeps its state per tensor, so whole
// tensors let the operator's own optimizer (any kind) step its share unchanged; the price is a
// coarser balance (the greedy split below is within one tensor of even).
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "dsgd/torch/operator.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

// owner[i] of each of `numels` (parameter sizes, in a fixed order) among `ranks`: largest first,
// each to the least-loaded rank (the lowest on ties), as PyTorch's ZeroRedundancyOptimizer does.
std::vector<int> partition_by_size(const std::vector<int64_t>& numels, int ranks);

// The parameters (TensorImpl addresses) a replica owns. Parameters of an optimizer that are not
// in it and not in `sharded` (say, frozen ones) are everyone's.
struct OwnedSet {
  std::unordered_set<const void*> owned;
  std::unordered_set<const void*> sharded;  // every parameter the partition covers
  bool empty() const { return sharded.empty(); }
  bool owns(const torch::Tensor& p) const;
};

// Erases every optimizer's state for parameters this replica does not own.
void drop_unowned_state(TrainingOperator& op, const OwnedSet& owned);

// Collective over the replicas of `sharing`: every replica's share of each optimizer's state is
// sent to all; where `keep`, it is merged into this replica's optimizers, which then hold the
// whole state (save_state writes it; drop_unowned_state lets go of it again).
void gather_optimizer_state(TrainingOperator& op, strategy::Sharing& sharing, bool keep);

}  // namespace dsgd::torch_glue
