#include "torch/replica/device.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cmath>

#include "dsgd/common/error.h"

// LibTorch 2.4 replaced autocast's per-device functions (set_enabled, set_cpu_enabled, ...) with
// ones that take the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DSGD_AUTOCAST_BY_DEVICE_TYPE 1
#endif

namespace dsgd::torch_glue {
namespace {

bool autocast_enabled(torch::DeviceType t) {
#ifdef DSGD_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(t);
#else
  return t == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

void set_autocast(torch::DeviceType t, bool enabled, torch::ScalarType dtype) {
#ifdef DSGD_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(t, dtype);
  at::autocast::set_autocast_enabled(t, enabled);
#else
  if (t == torch::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

torch::ScalarType autocast_dtype(torch::DeviceType t) {
#ifdef DSGD_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(t);
#else
  return t == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

}  // namespace

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
  was_enabled_ = autocast_enabled(type_);
  was_dtype_ = autocast_dtype(type_);
  set_autocast(type_, true, precision == Precision::kFp16 ? torch::kHalf : torch::kBFloat16);
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  set_autocast(type_, was_enabled_, was_dtype_);
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
