// The seam between a TrainingOperator and the runtime that runs it. The operator calls the
// runtime only through ReplicaHost (next batch, schedules, the gradient check, profiling), and
// the runtime reaches the operator's private registrations only through OperatorAccess: neither
// class knows the other's type.
//
//   OperatorAccess::attach(op, this, info);     // ReplicaRuntime's constructor
//   op.next_train_batch(batch);                 // -> host->next_batch(batch, 0)
//
// An operator with no host (made with make_operator and never run by a Trainer or
// ReplicaRuntime) throws dsgd::ConfigError from every call that needs one.
#pragma once

#include <cstdint>
#include <vector>

#include "dsgd/torch/operator.h"

namespace dsgd::torch_glue {

class ReplicaHost {
 public:
  virtual ~ReplicaHost() = default;
  // TrainingOperator::next_train_batch, after_batch, step_schedulers, check_gradients,
  // scale_loss and batches_per_epoch, as documented there.
  virtual bool next_batch(Batch& batch, int64_t max_batches) = 0;
  virtual void after_batch() = 0;
  virtual void step_schedules() = 0;
  virtual bool check_gradients() = 0;
  virtual torch::Tensor scale_loss(const torch::Tensor& loss) = 0;
  virtual int64_t batches_per_epoch() const = 0;
  // The default train_batch's reports: whether this call profiles, a phase's seconds (added up
  // per call), and the last batch's loss (for the driver's progress display).
  virtual bool profiling() const = 0;
  virtual void add_phase(const char* name, double seconds) = 0;
  virtual void report_loss(double loss) = 0;
};

// What the runtime may do to an operator beyond its public API.
struct OperatorAccess {
  static void attach(TrainingOperator& op, ReplicaHost* host, const ReplicaInfo& info) {
    op.host_ = host;
    op.info_ = info;
  }
  static void set_info(TrainingOperator& op, const ReplicaInfo& info) { op.info_ = info; }
  // The registered schedules (their base learning rates are filled in after setup).
  static std::vector<TrainingOperator::Schedule>& schedules(TrainingOperator& op) { return op.schedules_; }
  // The registered data (training, then validation: data and targets), to move to a device.
  static std::vector<torch::Tensor*> data(TrainingOperator& op) {
    return {&op.train_data_, &op.train_targets_, &op.val_data_, &op.val_targets_};
  }
};

}  // namespace dsgd::torch_glue
