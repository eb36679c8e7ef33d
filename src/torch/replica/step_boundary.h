// Whether a replica stands at a step's boundary, and how it gets back to one when a train() call
// throws (a lost peer aborted the group): unless the step's update had begun (torn()), the replica
// is where its last step ended, the CPU generator too, so its state can seed a new member without
// rolling anything back (the Trainer's recovery from a peer, runtime/driver/recovery.cpp). A part
// of ReplicaRuntime (replica.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>

namespace dsgd::torch_glue {

class StepBoundary {
 public:
  // A step ended (or a call begins): the CPU generator's state kept, to draw the next step's
  // (dropout) again after an interruption.
  void remember();
  // From a step's update (the optimizer stepped, the parameters or statistics being shared) to
  // its end. The first after gate_update() calls its `wait` first.
  void begin_update() {
    if (gate_) std::exchange(gate_, nullptr)();
    updating_ = true;
  }
  // Holds the next update until `wait` returns: a background checkpoint copies the parameters
  // and optimizer state while forward and backward run (runtime/worker/worker_shares.h).
  void gate_update(std::function<void()> wait) { gate_ = std::move(wait); }
  void end_update() { updating_ = false; }
  // The call threw: torn() if its update had begun; the generator back to the step's start.
  void interrupted();
  bool torn() const { return torn_; }
  // At a call's start, or after a load: at a boundary.
  void clear() { updating_ = torn_ = false; }

 private:
  bool updating_ = false;
  bool torn_ = false;
  std::function<void()> gate_;
  at::Tensor rng_;  // the CPU generator's state where the last step ended
};

}  // namespace dsgd::torch_glue
