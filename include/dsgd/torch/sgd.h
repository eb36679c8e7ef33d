// dsgd/torch/sgd.h — torch::optim::SGD whose step on CUDA parameters runs as a few multi-tensor
// kernels (LibTorch's _foreach ops, as PyTorch's Python SGD does by default) instead of three
// or four kernels per parameter: on ResNet-50's 161 parameters the per-parameter loop costs
// the GPU ~500 launches a step.
//
//   register_optimizer(std::make_unique<dsgd::FusedSGD>(model->parameters(),
//                                                       torch::optim::SGDOptions(0.1).momentum(0.9)));
//
// Same options, state (momentum_buffer), serialisation and arithmetic as torch::optim::SGD,
// which it is: checkpoints load into either. On the CPU, or with parameters on several devices,
// step() is torch::optim::SGD's own.
#pragma once

#include <torch/optim/sgd.h>

namespace dsgd {

class FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace dsgd
