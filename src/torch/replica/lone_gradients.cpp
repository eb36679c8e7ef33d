// A lone replica's gradients summed over a step's micro-batches (torch/replica/lone_gradients.h).
#include "torch/replica/lone_gradients.h"

#include <torch/types.h>
#include <torch/utils.h>

namespace dsgd::torch_glue {

bool LoneGradients::hold(TrainingOperator& op, bool last) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& m : op.models()) {
    for (auto& p : m->parameters()) {
      if (held_.size() <= i) held_.resize(i + 1);
      auto& held = held_[i++];
      const auto& g = p.grad();
      if (last) {
        if (held.defined() && g.defined()) p.mutable_grad().add_(held);
        if (held.defined() && !g.defined()) p.mutable_grad() = held;
        held = torch::Tensor();
      } else if (g.defined()) {
        held = held.defined() ? held.add_(g) : g.clone();
      }
    }
  }
  return last;
}

}  // namespace dsgd::torch_glue
