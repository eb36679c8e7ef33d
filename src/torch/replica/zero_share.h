// A replica's share under step.zero_stage over a strategy that averages (torch/sync/zero.h): its
// pieces of the parameters (each GradSync's ShardLayout: a flat slice of every bucket), which its
// optimizers step in place of the parameters; the pieces' averaged gradients given to them
// before the step and the updated pieces gathered into every replica after it; clipping from
// every replica's pieces; and the optimizer state gathered whole for a save and sliced back
// after it or after a load. At stage 3 the parameters themselves are sharded
// (torch/sync/sharded_parameters.h): the pieces are views of each GradSync's shard, the units
// forward names are gathered as it goes (torch/replica/unit_gathers.h), nothing is gathered
// after the step, and everything that reads the parameters whole (a save, a broadcast,
// validate) gathers them first. A part of ReplicaRuntime (replica.h).
#pragma once

#include <memory>
#include <vector>

#include "dsgd/torch/operator.h"
#include "torch/replica/options.h"
#include "torch/replica/unit_gathers.h"
#include "torch/sync/grad_sync.h"
#include "torch/sync/sharded_parameters.h"
#include "torch/sync/zero.h"

namespace dsgd::torch_glue {

class ZeroShare {
 public:
  using Syncs = std::vector<std::unique_ptr<GradSync>>;
  // Reads all three as they are at each call.
  ZeroShare(TrainingOperator& op, const ReplicaOptions& options, Syncs& syncs)
      : op_(op), options_(options), syncs_(syncs) {}

  // After the GradSyncs are made: this replica's pieces, and its optimizers stepping them
  // (nothing under stage 0, alone or without syncs). A whole state held (loaded) is sliced; the
  // pieces of a layout that changed are let go of, with their state (a load follows).
  void partition();
  bool active() const { return !pieces_.empty(); }
  // This replica's pieces (by parameter; empty: not sharded) and the optimizers' groups as
  // registered, for sharded checkpoints, which write and read the pieces' ranges
  // (torch/replica/state_shares.cpp).
  std::pair<const Pieces&, const OptimizerParams&> layout() const { return {pieces_, whole_}; }
  // Stage 2's ring buffers per GradSync in a group of `world_size` (0: stage 0 or 1, or alone),
  // and the replicas the GradSyncs shard over (0: none).
  size_t ring_buckets(int world_size) const;
  int shards(int world_size) const;

  // The step's gradients are checked: the pieces get their averages, the optimizer steps them.
  void before_step();
  // After the optimizer's step: the updated pieces gathered into every replica (a collective).
  void after_step();
  // A step cut short, or a state loaded: nothing to share.
  void forget_step() { share_after_step_ = false; }
  // clip_grad_norm_ over the pieces' averages: the global norm from every replica's sums of
  // squares (a collective). Returns the norm before.
  double clip(double max_norm);

  // Collective: every replica's pieces' optimizer state to all; where `keep`, this replica's
  // optimizers hold the parameters again with the state whole (for save_state).
  void gather_state(bool keep);
  // The optimizers step the pieces again, a whole state held sliced (after a save or a load).
  void drop_unowned();
  // Before a load: the optimizers hold the parameters, the pieces' state let go of (stage 3:
  // and the parameters' memory back, for the load to write into).
  void prepare_load();

  // ---- stage 3 ----
  bool gathers() const { return units_.active(); }  // the parameters are sharded
  // The gate: forward is about to use one layer's parameters.
  void enter(const std::vector<torch::Tensor>& params) { units_.enter(params); }
  void gather_parameters() { units_.gather_all(); }  // collective: whole on every replica
  void release_parameters() { units_.release_all(); }
  // What parameter_bytes reports for the models' tensors of `whole` bytes: less what the
  // sharded parameters would take whole, plus what this replica holds of them now.
  double held_bytes(double whole) const;
  // Throws dsgd::Error unless the parameters are whole here (`what` reads them).
  void require_whole(const char* what) const;

 private:
  Pieces make_pieces() const;  // each GradSync's ShardLayout's pieces, viewing the parameters as they are now
  // Stage 3: each GradSync's ShardedParameters kept or made (true: one made), the units reset.
  bool shard_parameters();

  TrainingOperator& op_;
  const ReplicaOptions& options_;
  Syncs& syncs_;
  Pieces pieces_;                  // by parameter (empty: not sharded)
  OptimizerParams whole_;          // the optimizers' groups as registered
  bool stepping_pieces_ = false;   // the optimizers hold the pieces
  bool share_after_step_ = false;  // a step was taken over the pieces: after_step gathers them
  std::vector<std::unique_ptr<ShardedParameters>> params_;  // stage 3: per GradSync (null: not sharded)
  UnitGathers units_;
};

}  // namespace dsgd::torch_glue
