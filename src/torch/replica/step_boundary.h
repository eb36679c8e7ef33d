// Whether a replica stands at a step's boundary, and how it gets back to one when a train() call
// throws (a lost peer aborted the group): unless the step's update had begun (torn()), the replica
// is where its last step ended, the CPU generator too, so its state can seed a new member without
// rolling anything back (the Trainer's recovery from a peer, runtime/driver/recovery.cpp). A part
// of ReplicaRuntime (replica.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace dsgd::torch_glue {

class StepBoundary {
 public:
  // A step ended (or a call begins): the CPU generator's state kept, to draw the next step's
  // (dropout) again after an interruption.
  void remember();
  // From a step's update (the optimizer stepped, the parameters or statistics being shared) to
  // its end.
  void begin_update() { updating_ = true; }
  void end_update() { updating_ = false; }
  // The call threw: torn() if its update had begun; the generator back to the step's start.
  void interrupted();
  bool torn() const { return torn_; }
  // At a call's start, or after a load: at a boundary.
  void clear() { updating_ = torn_ = false; }

 private:
  bool updating_ = false;
  bool torn_ = false;
  at::Tensor rng_;  // the CPU generator's state where the last step ended
};

}  // namespace dsgd::torch_glue
