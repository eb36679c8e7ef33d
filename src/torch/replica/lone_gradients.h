// A lone replica (no strategy: nothing averages its micro-batches' gradients) accumulating over
// step.accumulate_steps micro-batches: the gradients summed aside until the step's last, which
// gets the sum back. A part of ReplicaRuntime (replica.h).
#pragma once

#include <vector>

#include "dsgd/torch/operator.h"

namespace dsgd::torch_glue {

class LoneGradients {
 public:
  // After a micro-batch's backward: before the step's `last`, adds every parameter's .grad into
  // the sum aside; at the last, adds the sum into .grad (and forgets it). Returns `last`.
  bool hold(TrainingOperator& op, bool last);
  void clear() { held_.clear(); }  // the step starts again

 private:
  std::vector<torch::Tensor> held_;  // by parameter, over every model
};

}  // namespace dsgd::torch_glue
