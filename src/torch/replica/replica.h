// One replica: a TrainingOperator plus what dsgd adds around it, on one training thread. Worker
// processes hold devices_per_worker of these. Its parts, each owning its state:
//   torch/replica/batch_cursor.h    the position, the epoch's order, the next (micro-)batch
//   torch/replica/step_times.h      live progress for the heartbeat, a call's profile
//   torch/replica/step_boundary.h   whether a thrown call left the state at a step's end
//   torch/replica/zero_share.h      step.zero_stage: the share this replica steps
//   torch/replica/lone_gradients.h  a lone replica's accumulated gradients
//   torch/replica/deferred_steps.h  the forward overlap's held-back optimizer steps
//   torch/sync/grad_sync.h          the gradient hooks, one GradSync per model, into the strategy
// and what it uses: torch/state/ (the state as bytes, named tensors, the broadcast from one
// replica into others; ReplicaRuntime's side: saved_state.cpp), torch/sync/server_optimizer.h
// (SGD on the parameter servers; sharded_state.cpp). ReplicaRuntime ties them together, checks
// and clips the gradients, schedules the learning rates, and is the operator's ReplicaHost
// (torch/replica/host.h).
//
//   ReplicaRuntime r(make_operator("image_classifier"), options);
//   r.setup(config);
//   r.attach(strategy);               // gradient hooks (null: a lone replica)
//   Metrics m = r.train(0, false);    // to the end of the epoch
//
// The position (epoch, next batch) is saved in checkpoints and does not depend on the number of
// replicas, so a job saved with 2 workers resumes with 3 at the same sample.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsgd/common/choice.h"
#include "dsgd/torch/operator.h"
#include "dsgd/torch/parameter_gate.h"
#include "dsgd/torch/sync_batchnorm.h"
#include "dsgd/common/trainer_config.h"
#include "strategy/strategy.h"
#include "torch/replica/batch_cursor.h"
#include "torch/replica/deferred_steps.h"
#include "torch/replica/grad_check.h"
#include "torch/replica/host.h"
#include "torch/replica/lone_gradients.h"
#include "torch/replica/loss_scaler.h"
#include "torch/replica/options.h"
#include "torch/replica/step_boundary.h"
#include "torch/replica/step_times.h"
#include "torch/replica/zero_share.h"
#include "torch/state/broadcast.h"
#include "torch/state/replica_state.h"
#include "torch/state/state_share.h"
#include "torch/sync/grad_sync.h"

namespace dsgd::torch_glue {


class ReplicaRuntime : private ParameterGate, private ReplicaSums, private ReplicaHost {
 public:
  ReplicaRuntime(std::unique_ptr<TrainingOperator> op, const ReplicaOptions& options);
  ~ReplicaRuntime();

  // Seeds LibTorch, runs the operator's setup; throws ConfigError if it registered no model.
  // Then moves the models and the registered data to info.device. On CUDA the data goes to the
  // GPU whole when it takes at most a quarter of the GPU's free memory (batches are then cut
  // there); else it is pinned, and each batch is gathered into pinned memory and copied over
  // asynchronously.
  void setup(const nlohmann::json& config);
  // "name shape dtype" per parameter and buffer of every model, one per line.
  std::string signature() const;
  // A new place in a re-formed job (after a worker was lost): rank, world size, worker.
  void set_info(int rank, int world_size, int worker);
  // Installs gradient hooks averaging through `strategy` (null: a lone replica, or the driver's
  // copy; then the hooks only check each gradient for NaN, see grad_check.h).
  // A strategy that updates on its servers takes each model's SGD from its optimizers (throws
  // ConfigError where a model's parameters are not all in one torch::optim::SGD param group).
  void attach(std::shared_ptr<strategy::GradientStrategy> strategy);
  // Collective, on every replica: the optimizer state the strategy's servers hold comes back
  // into the optimizers, so save_state() is whole (nothing to do for other strategies). Under
  // step.zero_stage, every replica's share of the optimizer state goes to all, and those that
  // `keep` merge it into their optimizers (the others only send theirs).
  void gather_server_state(bool keep = true);
  // After the gathered state was saved (or where it is not needed): the optimizers let go of the
  // servers' momentum again, which lives on the servers only, and of the state of parameters
  // another replica owns under step.zero_stage.
  void drop_server_state_copy();

  // Runs the operator's train_epoch from the current position for at most max_batches batches
  // (0 = to the end of the epoch); the epoch advances when finished. With step.accumulate_steps
  // N, a batch (a step) is N micro-batches: the operator's train_batch runs N times per step,
  // and positions, batches_per_epoch and the "batches" metric count steps. Adds profile times when
  // asked: forward_s, backward_s, comm_wait_s, optimizer_s (means per batch; as
  // TrainOptions::profile says), epoch_s.
  Metrics train(int64_t max_batches, bool profile);
  // The steps' times (torch/replica/step_times.h): steady_step_seconds() of the last train() call,
  // and progress(), the live figures the worker's heartbeat thread reads.
  StepTimes& times() { return times_; }
  // With forward_overlap_buckets -1: T for the next train() calls (0 = off). Every replica must
  // set the same T before the same step.
  void set_forward_overlap_buckets(size_t buckets);
  size_t num_buckets() const { return syncs_.empty() ? 0 : syncs_[0]->num_buckets(); }
  Metrics validate();

  // Models, optimizers, schedules, position and the operator's extra state, as bytes.
  std::string save_state() const;
  // save_state().size(), without keeping the bytes (a serialisation all the same). The driver's
  // snapshot schedule asks once the first steps have given the optimizers their state.
  size_t state_bytes() const;
  // The shared memory its GradSyncs will ask the strategy for in a group of `world_size`
  // replicas: each model's trainable float32 parameters, 64-byte aligned, or under ZeRO stage 2
  // its ring of buckets (comm::ShmOptions::shared_bytes for the replica's group).
  size_t gradient_bytes(int world_size) const;
  // Drops steps still pending (forward overlap). `feedback`: this replica's save_feedback() from
  // the same point, or "" (the error feedback then starts from zero).
  void load_state(const std::string& bytes, const std::string& feedback = {});
  // Collective over `sharing`'s replicas (the group's broadcast, torch/state/broadcast.h):
  // replica `root`'s state, as save_state() would write it, into every replica with `load`, with
  // no archive in between; the others take part and keep theirs. A loaded replica is where
  // load_state would leave it (error feedback from zero). Returns the bytes that crossed. Not
  // under ZeRO stage 3 (throws dsgd::Error): no replica holds the whole parameters of the step.
  size_t share_state(strategy::Sharing& sharing, int root, bool load);
  // A standby's: its optimizers' state tensors made now (make_spare_state), which share_state
  // then fills instead of allocating; let go of at the next load.
  void make_spare_state();
  // This replica's error feedback (compression: GradSync's residuals and PowerSGD states), "" when
  // it keeps none. Per replica: each host leader's differs. load_state takes it back; bytes of
  // another layout (bucket sizes, models) are dropped with a notice and feedback starts at zero.
  std::string save_feedback() const;
  // This replica's share of a sharded checkpoint (torch/state/state_share.h), regions into its
  // tensors: of its ZeRO pieces, its own; of what every replica holds alike, its turn of the
  // bytes (`spread`), or everything from the first replica alone (a ps strategy's, whose
  // optimizer state was gathered into the first: gather_server_state). Stage 3 needs no gather.
  StateShare write_share(bool spread) const;
  // Loads a sharded checkpoint saved by any world, stage and strategy, as load_state does: each
  // whole tensor it holds, and of the sharded ones its pieces' ranges only. Error feedback only
  // from a world of this size. ConfigError for a tensor missing or of another shape.
  void read_share(StateSource& source);
  // The models' named parameters and buffers ("model<i>.<name>" for i > 0). Under ZeRO stage 3
  // only while gathered (gather_server_state(true) until drop_server_state_copy): else throws.
  std::vector<std::pair<std::string, torch::Tensor>> named_tensors() const;

  const Position& position() const { return cursor_.position(); }
  // Where the replica stands in its step. torn(): whether the last train() call threw after a
  // step's update began and before the step ended (the optimizer stepped, or the parameters or
  // statistics were being shared): the state is at no step's boundary. One that threw elsewhere
  // is back where its last step ended (the CPU generator too), so its state may be given to
  // other replicas as it is. gate_update(): a background checkpoint's copy holds the next update.
  StepBoundary& boundary() { return boundary_; }
  void step_schedules() override;  // one scheduler step (manual mode, or per the frequency)
  TrainingOperator& op() { return *op_; }
  const ReplicaOptions& options() const { return options_; }

  int64_t batches_per_epoch() const override { return cursor_.batches_per_epoch(); }


 private:
  // ReplicaHost: what the operator calls.
  bool next_batch(Batch& batch, int64_t max_batches) override;
  void after_batch() override;
  // After backward: true if the (averaged) gradients are finite. Otherwise, per the policy,
  // counts a skipped step and warns (skip) or throws dsgd::Error naming the step (error).
  // With loss scaling: unscales a lone replica's gradients first; a non-finite gradient
  // (above the minimum scale) skips the step and backs the scale off whatever the policy.
  bool check_gradients() override;
  torch::Tensor scale_loss(const torch::Tensor& loss) override;
  bool profiling() const override { return times_.profiling(); }
  void add_phase(const char* name, double seconds) override { times_.add_phase(name, seconds); }
  void report_loss(double loss) override { times_.progress().loss = loss; }

  // wait_for_parameters lands here during train(): under ZeRO stage 3 the layer is gathered
  // (ZeroShare::enter); with the forward overlap, GradSync's held-back buckets of its parameters
  // are applied by deferred_.
  void wait_layer(const std::vector<torch::Tensor>& parameters) override;
  // SyncBatchNorm's sums over the replicas (dsgd/torch/sync_batchnorm.h) land here during train(): the
  // strategy's average of the floats, times the replicas.
  void sum(float* data, size_t count) override;
  double weight() const override { return cursor_.weight(); }
  void to_device();  // after setup: models and data to info.device
  void step_schedules_to(int64_t t);
  void set_weights();  // the batch's weight / the loss scale, into every GradSync
  // check_gradients' end for finite gradients: clipped, if asked; the step begins.
  bool take_step();
  // A lone replica's gradients, unscaled, checked: whether all are finite. `summed`: the step's
  // micro-batches were summed aside (LoneGradients), so the hooks' checks saw parts only.
  bool lone_gradients_finite(bool summed);
  // After each step, with a strategy that averages: every model's float running statistics
  // (buffers named *running_mean, *running_var: BatchNorm's) averaged over the replicas, so
  // every replica holds the same buffers (and snapshots, checkpoints and get_model agree).
  void sync_statistics();
  // train()'s profile and figures into its metrics.
  void add_call_metrics(Metrics* m, int64_t batches, double epoch_s, int64_t bytes0);
  // train() threw: back to the last step's end (StepBoundary), nothing held for the step.
  void interrupted();
  ReplicaState state() const;  // what save_state writes besides the operator's
  void restored(const ReplicaState& state);  // load_state's and share_state's bookkeeping after the load

  std::unique_ptr<TrainingOperator> op_;
  ReplicaOptions options_;
  std::vector<std::unique_ptr<GradSync>> syncs_;
  std::unique_ptr<GradCheck> check_;                                    // with no strategy
  DeferredSteps deferred_;
  std::unordered_map<const void*, std::pair<size_t, size_t>> gate_index_;  // TensorImpl -> (sync, param)
  BatchCursor cursor_{*op_, options_};
  StepTimes times_;
  StepBoundary boundary_;
  ZeroShare zero_{*op_, options_, syncs_};
  LoneGradients lone_;
  std::optional<LossScaler> scaler_;  // loss scaling, if on
  int64_t schedule_t_ = 0;
  int64_t skipped_this_call_ = 0;
  torch::Tensor stats_flat_;  // sync_statistics's buffer
  SpareTensors spares_;       // make_spare_state's, until a load
};

}  // namespace dsgd::torch_glue
