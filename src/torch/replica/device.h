// Devices and precisions of replicas: which device a replica computes on, autocast switched on
// and off the same way under LibTorch 1.13 and 2.x (whose APIs differ), and a gradient check
// that costs a GPU one kernel and one host sync.
//
//   o.info.device = replica_device(Device::kAuto, worker * devices_per_worker + replica);
//   { AutocastScope bf16(o.info.device, Precision::kBf16);  ... forward, loss ... }
#pragma once

#include <torch/types.h>

#include <vector>

#include "dsgd/common/choice.h"

namespace dsgd::torch_glue {

// The device of the replica numbered `index` on its host: the CPU, or cuda:(index % GPUs) (so
// replicas share GPUs when there are fewer). auto: CUDA when LibTorch sees a GPU. Throws
// ConfigError for cuda where LibTorch sees none, saying why that may be.
torch::Device replica_device(Device choice, int index);

// While it lives, this thread's forward ops on `device` run under autocast in `precision`
// (fp32: nothing changes); the previous state comes back at its end.
class AutocastScope {
 public:
  AutocastScope(torch::Device device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  // Drops autocast's low-precision copies of the weights: due after every optimizer step, which
  // changes the weights in place.
  static void clear_cache();

 private:
  bool on_ = false;
  torch::DeviceType type_ = torch::kCPU;
  bool was_enabled_ = false;
  torch::ScalarType was_dtype_ = torch::kFloat32;
};

// Whether every element of every tensor is finite. CUDA tensors of one device: one multi-tensor
// kernel (GradScaler's) and one host sync; others: one sum each and one sync.
bool all_finite(const std::vector<torch::Tensor>& tensors);

}  // namespace dsgd::torch_glue
