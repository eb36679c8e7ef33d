// dsgd/torch/parameter_gate.h — the forward pass's side of overlapping communication with the next
// step (TrainerConfig::comm.forward_overlap_buckets).
//
// With forward_overlap_buckets > 0, backward returns before the deferred buckets' averages have
// arrived, and each bucket's optimizer step is taken when it lands, while the next forward
// already runs: a model calls wait_for_parameters on each layer just before using it, and the
// call returns once that layer's parameters hold the step's update.
//
//   torch::Tensor forward(const torch::Tensor& x) override {
//     dsgd::wait_for_parameters(*fc1_);  x = torch::relu(fc1_(x));
//     dsgd::wait_for_parameters(*fc2_);  return fc2_(x);
//   }
//
// Outside a dsgd replica's training, or with the option off, the calls do nothing (a lookup).
// A model that does not cover every parameter it uses is trained without the overlap (the
// runtime checks each forward), so a missing call costs speed, never correctness.
//
// Under ZeRO stage 3 (TrainerConfig::step.zero_stage 3) the same calls name the model's units:
// each call's parameters are gathered whole just before the layer runs and released after it,
// so a call per layer you want gathered at a time (a transformer block, a top-level child). A
// parameter used without a call would be read while released: the first step checks that every
// parameter that gets a gradient was named, and fails with ConfigError if not.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <vector>

namespace dsgd {

void wait_for_parameters(const torch::nn::Module& layer);  // its parameters, recursively
void wait_for_parameters(const torch::Tensor& parameter);

// ---- for the runtime: the gate the calling thread's calls go to ----
class ParameterGate {
 public:
  virtual ~ParameterGate() = default;
  virtual void wait(const torch::Tensor& /*parameter*/) {}
  // One call's parameters (a layer's, or one tensor): each waited for, unless a gate does more.
  virtual void wait_layer(const std::vector<torch::Tensor>& parameters) {
    for (const auto& p : parameters) wait(p);
  }
};
// Installs `gate` (null: none) for the calling thread; returns the one it replaces.
ParameterGate* set_thread_parameter_gate(ParameterGate* gate);

}  // namespace dsgd
