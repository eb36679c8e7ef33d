// A replica's share under step.zero_stage over a strategy that averages (torch/sync/zero.h): which
// trainable parameters it steps (a partition by size over all models, into every GradSync), the
// step over its share only (the others' gradients let go, the updated parameters shared after the
// step), stage 2's clipping from every replica's share, and the optimizer state gathered whole
// for a save and trimmed back to the share. A part of ReplicaRuntime (replica.h).
#pragma once

#include <memory>
#include <vector>

#include "dsgd/torch/operator.h"
#include "torch/replica/options.h"
#include "torch/sync/grad_sync.h"
#include "torch/sync/zero.h"

namespace dsgd::torch_glue {

class ZeroShare {
 public:
  using Syncs = std::vector<std::unique_ptr<GradSync>>;
  // Reads all three as they are at each call.
  ZeroShare(TrainingOperator& op, const ReplicaOptions& options, Syncs& syncs)
      : op_(op), options_(options), syncs_(syncs) {}

  // After the GradSyncs are made: each parameter's owner; nothing under stage 0, alone or
  // without syncs. A state loaded whole keeps only this replica's share.
  void partition();
  bool active() const { return !owned_.empty(); }
  const OwnedSet& owned() const { return owned_; }
  // Stage 2's ring buffers per GradSync in a group of `world_size` (0: stage 0 or 1, or alone).
  size_t ring_buckets(int world_size) const;

  // The step's gradients are checked: the optimizer is to step this replica's share only.
  void before_step();
  // After the optimizer's step: the updated parameters shared with every replica (a collective).
  void after_step();
  // A step cut short, or a state loaded: nothing to share.
  void forget_step() { share_after_step_ = false; }
  // clip_grad_norm_ where each replica holds only its share's gradients (stage 2): the global
  // norm from every replica's sum of squares (a collective). Returns the norm before.
  double clip(double max_norm);

  // Collective: every replica's share of the optimizer state to all; merged where `keep`.
  void gather_state(bool keep);
  // The optimizer state of parameters another replica owns let go of (after a load or a save).
  void drop_unowned() { drop_unowned_state(op_, owned_); }

 private:
  TrainingOperator& op_;
  const ReplicaOptions& options_;
  Syncs& syncs_;
  OwnedSet owned_;                 // the parameters this replica steps (empty: all)
  bool share_after_step_ = false;  // a step was taken over the share: after_step shares it
};

}  // namespace dsgd::torch_glue
