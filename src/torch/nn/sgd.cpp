#include "dsgd/torch/sgd.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>

#include <optional>

#include "torch/state/optimizer_state.h"

namespace dsgd {

torch::Tensor FusedSGD::step(LossClosure closure) {
  std::optional<torch::Device> device;
  bool fused = true;
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!device) device = p.device();
      fused = fused && p.device() == *device && p.is_cuda() && !p.grad().is_sparse();
    }
  }
  if (!device || !fused) return torch::optim::SGD::step(std::move(closure));

  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    std::vector<torch::Tensor> params, grads;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (params.empty()) continue;
    if (o.weight_decay() != 0) grads = at::_foreach_add(grads, params, o.weight_decay());
    if (o.momentum() != 0) {
      std::vector<torch::Tensor> bufs(params.size()), old_bufs, old_grads;
      for (size_t i = 0; i < params.size(); ++i) {
        const auto key = torch_glue::optimizer_state_key(*this, params[i]);
        auto it = state().find(key);
        if (it == state().end()) {  // the first step: the buffer starts as the gradient
          bufs[i] = torch::clone(grads[i]).detach();
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(bufs[i]);
          state()[key] = std::move(s);
        } else {
          bufs[i] = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
          old_bufs.push_back(bufs[i]);
          old_grads.push_back(grads[i]);
        }
      }
      if (!old_bufs.empty()) {
        at::_foreach_mul_(old_bufs, o.momentum());
        at::_foreach_add_(old_bufs, old_grads, 1 - o.dampening());
      }
      grads = o.nesterov() ? at::_foreach_add(grads, bufs, o.momentum()) : bufs;
    }
    at::_foreach_add_(params, grads, -o.lr());
  }
  return loss;
}

}  // namespace dsgd
