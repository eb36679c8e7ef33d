// Where a replica stands in its epochs, and its next batch: the position (epoch, next step), the
// epoch's order (a permutation drawn from the seed and the epoch alone), the micro-batch of the
// step in progress under step.accumulate_steps, and the rows of this replica's part of it
// (torch/replica/sampler.h), read from the registered data or dataset onto the replica's device.
// A part of ReplicaRuntime (replica.h).
//
//   BatchCursor cursor(op, options);
//   while (cursor.next(batch, max_steps)) { ...; if (!cursor.end_micro_batch()) { ...; cursor.end_step(); } }
#pragma once

#include <cstdint>
#include <string>

#include "dsgd/torch/operator.h"
#include "torch/replica/options.h"
#include "torch/replica/sampler.h"
#include "torch/state/replica_state.h"

namespace dsgd::torch_glue {

class BatchCursor {
 public:
  // Reads both as they are at each call (set_info changes the options' rank and world size).
  BatchCursor(const TrainingOperator& op, const ReplicaOptions& options) : op_(op), options_(options) {}

  // The next micro-batch of the step at the position into *batch; false at the epoch's end, or
  // between steps once `max_steps` (> 0) were taken in this call. Sets weight() and loss_factor().
  bool next(Batch& batch, int64_t max_steps);
  // After a micro-batch's backward: true while the step goes on with its next micro-batch.
  bool end_micro_batch();
  // The step's update is done: the position moves to the next step.
  void end_step() { ++position_.batch; }
  // At a train() call's end: past the epoch's last step, the next epoch. True if it moved.
  bool end_epoch();
  // The step in progress starts again from its first micro-batch (a call that threw, a load).
  void restart_step() { micro_ = 0; }

  void begin_call() { taken_ = 0; }
  int64_t steps_taken() const { return taken_; }  // steps begun in this call
  const Position& position() const { return position_; }
  void set_position(const Position& p) { position_ = p; }
  // The steps the position stands for: epoch x batches_per_epoch() + batch.
  int64_t step() const { return position_.epoch * batches_per_epoch() + position_.batch; }

  int64_t batches_per_epoch() const;        // steps (of step.accumulate_steps micro-batches)
  int64_t micro_batches_in_step() const;    // accumulate_steps, or fewer in an epoch's last step
  int64_t micro() const { return micro_; }  // the micro-batch of the step in progress (0 between steps)
  bool last_micro_batch() const { return micro_ + 1 >= micro_batches_in_step(); }
  // This micro-batch's share of the step (EpochSampler::weight), and its loss's weight in the step
  // (its samples over the step's; 1 without accumulation).
  double weight() const { return weight_; }
  double loss_factor() const { return loss_factor_; }
  std::string where() const;  // "epoch E, batch B" of the step in progress (1-based)

 private:
  EpochSampler sampler() const;  // of micro-batches, with accumulation
  void start_epoch_order();
  // Rows `idx` of registered data, on the replica's device.
  torch::Tensor gather(const torch::Tensor& data, const torch::Tensor& idx) const;

  const TrainingOperator& op_;
  const ReplicaOptions& options_;
  Position position_;
  torch::Tensor order_;  // the current epoch's permutation
  int64_t order_epoch_ = -1;
  int64_t micro_ = 0;
  int64_t taken_ = 0;
  double weight_ = 1.0;
  double loss_factor_ = 1.0;
};

}  // namespace dsgd::torch_glue
