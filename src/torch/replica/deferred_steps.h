// The forward overlap's optimizer steps (TrainerConfig::comm.forward_overlap_buckets): GradSync holds
// some buckets of a step back past backward, and each is applied here when the next forward
// reaches its layer, with the learning rates of the step it belongs to.
//
//   DeferredSteps steps(op, policy, /*warn=*/rank == 0);
//   steps.reset(num_syncs);
//   steps.begin(s, "epoch 1, batch 5");            // GradSync s's backward ended, buckets held back
//   bool newly_skipped = steps.apply(s, params, finite);   // one bucket's parameters arrived
//
// Every optimizer holding some of a bucket's parameters steps with only those visible (the other
// parameters' .grad hidden meanwhile). A non-finite bucket skips its own step (and warns once per
// step) or, with NonfinitePolicy::kError, throws dsgd::Error naming the step. Not thread-safe:
// the replica's training thread calls it.
#pragma once

#include <string>
#include <vector>

#include "dsgd/common/choice.h"
#include "dsgd/torch/operator.h"

namespace dsgd::torch_glue {

class DeferredSteps {
 public:
  DeferredSteps(TrainingOperator& op, NonfinitePolicy policy, bool warn);

  // One record per GradSync of the replica, none pending.
  void reset(size_t syncs);
  // Whether this replica warns of skipped steps (rank 0 does; ranks change with recoveries).
  void set_warn(bool warn) { warn_ = warn; }
  // GradSync `sync` held a step back: its learning rates now, and where it is ("epoch E, batch B").
  void begin(size_t sync, std::string where);
  // The held-back bucket holding `params` arrived averaged (`finite` or not): takes its step.
  // Returns true when this makes the step count as skipped (its first non-finite bucket).
  bool apply(size_t sync, const std::vector<torch::Tensor>& params, bool finite);

 private:
  struct Step {
    std::vector<std::vector<double>> lrs;  // per optimizer, per param group, at the step's backward
    std::string where;
    bool skipped = false;                  // a bucket of it was not finite
  };
  TrainingOperator& op_;
  const NonfinitePolicy policy_;
  bool warn_;
  std::vector<Step> steps_;  // per GradSync
};

}  // namespace dsgd::torch_glue
