#include "dsgd/torch/parameter_gate.h"

namespace dsgd {
namespace {

thread_local ParameterGate* current_gate = nullptr;

}  // namespace

ParameterGate* set_thread_parameter_gate(ParameterGate* gate) {
  ParameterGate* previous = current_gate;
  current_gate = gate;
  return previous;
}

void wait_for_parameters(const torch::Tensor& parameter) {
  if (current_gate != nullptr) current_gate->wait_layer({parameter});
}

void wait_for_parameters(const torch::nn::Module& layer) {
  if (current_gate == nullptr) return;
  current_gate->wait_layer(layer.parameters());
}

}  // namespace dsgd
