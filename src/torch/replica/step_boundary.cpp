// A replica's step boundary (torch/replica/step_boundary.h).
#include "torch/replica/step_boundary.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

namespace dsgd::torch_glue {

void StepBoundary::remember() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  rng_ = gen.get_state();
}

void StepBoundary::interrupted() {
  torn_ = updating_;
  updating_ = false;
  if (rng_.defined()) {  // the interrupted step's draws (dropout) are drawn again
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_);
  }
}

}  // namespace dsgd::torch_glue
