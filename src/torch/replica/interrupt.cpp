// ReplicaRuntime where a train() call throws (a lost peer aborted the group): what it keeps so
// that, unless the step's update had begun (torn()), the replica is back where its last step
// ended and its state can seed a new member without rolling anything back (Trainer's recovery
// from a peer, runtime/driver/trainer_recovery.cpp).
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "torch/replica/replica.h"

namespace dsgd::torch_glue {

void ReplicaRuntime::remember_step_rng() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  step_rng_ = gen.get_state();
}

void ReplicaRuntime::interrupted() {
  torn_ = stepping_;
  stepping_ = false;
  micro_ = 0;  // the step starts again from its first micro-batch
  held_grads_.clear();
  share_after_step_ = false;
  if (step_rng_.defined()) {  // the interrupted step's draws (dropout) are drawn again
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(step_rng_);
  }
}

}  // namespace dsgd::torch_glue
