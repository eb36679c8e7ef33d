// Autocast's per-thread state for one device type, read and set the same way under LibTorch 1.13
// and 2.x (whose APIs differ): AutocastScope (torch/replica/device.h) switches it for a
// replica's forward; activation checkpointing's recompute puts back the forward's.
#pragma once

#include <torch/types.h>

namespace dsgd::torch_glue {

struct AutocastState {
  bool enabled = false;
  torch::ScalarType dtype = torch::kFloat32;
};

AutocastState autocast_state(torch::DeviceType type);
void set_autocast_state(torch::DeviceType type, const AutocastState& state);

}  // namespace dsgd::torch_glue
