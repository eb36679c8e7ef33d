#include "torch/replica/device.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include <cmath>

#include "dsgd/common/error.h"
#include "torch/nn/autocast_state.h"

namespace dsgd::torch_glue {

torch::Device replica_device(Device choice, int index) {
  if (choice == Device::kCpu) return torch::kCPU;
  const bool cuda = torch::cuda::is_available();
  if (!cuda) {
    if (choice == Device::kAuto) return torch::kCPU;
    throw ConfigError("device cuda: this process's LibTorch sees no CUDA device (a CPU-only LibTorch, such as "
                      "Debian's libtorch-dev, or no GPU visible: check nvidia-smi and CUDA_VISIBLE_DEVICES); use "
                      "device cpu or auto");
  }
  const auto n = static_cast<int>(torch::cuda::device_count());
  return {torch::kCUDA, static_cast<torch::DeviceIndex>(index % n)};
}

AutocastScope::AutocastScope(torch::Device device, Precision precision) : type_(device.type()) {
  if (precision == Precision::kFp32) return;
  on_ = true;
  const auto was = autocast_state(type_);
  was_enabled_ = was.enabled;
  was_dtype_ = was.dtype;
  set_autocast_state(type_, {true, precision == Precision::kFp16 ? torch::kHalf : torch::kBFloat16});
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  set_autocast_state(type_, {was_enabled_, was_dtype_});
  if (!was_enabled_) clear_cache();
}

void AutocastScope::clear_cache() { at::autocast::clear_cache(); }

bool all_finite(const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return true;
  const auto device = tensors[0].device();
  bool fused = device.is_cuda();
  for (const auto& t : tensors) {
    fused = fused && t.device() == device && t.layout() == torch::kStrided &&
            (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16 ||
             t.scalar_type() == torch::kFloat16);
  }
  if (fused) {
    auto found = torch::zeros({1}, torch::TensorOptions().device(device).dtype(torch::kFloat32));
    const auto one = torch::ones({1}, found.options());
    std::vector<torch::Tensor> list(tensors.begin(), tensors.end());  // scaled by 1 in place: unchanged
    at::_amp_foreach_non_finite_check_and_unscale_(list, found, one);
    return found.item<float>() == 0.0f;
  }
  std::vector<torch::Tensor> sums;
  for (const auto& t : tensors) sums.push_back(t.sum().to(torch::kFloat64).cpu());
  return std::isfinite(torch::stack(sums).sum().item<double>());
}

}  // namespace dsgd::torch_glue
