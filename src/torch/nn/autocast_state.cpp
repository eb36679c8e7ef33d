#include "torch/nn/autocast_state.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

// LibTorch 2.4 replaced autocast's per-device functions (set_enabled, set_cpu_enabled, ...) with
// ones that take the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DSGD_AUTOCAST_BY_DEVICE_TYPE 1
#endif

namespace dsgd::torch_glue {

AutocastState autocast_state(torch::DeviceType t) {
#ifdef DSGD_AUTOCAST_BY_DEVICE_TYPE
  return {at::autocast::is_autocast_enabled(t), at::autocast::get_autocast_dtype(t)};
#else
  if (t == torch::kCUDA) return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
  return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
#endif
}

void set_autocast_state(torch::DeviceType t, const AutocastState& s) {
#ifdef DSGD_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(t, s.dtype);
  at::autocast::set_autocast_enabled(t, s.enabled);
#else
  if (t == torch::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(s.dtype);
    at::autocast::set_enabled(s.enabled);
  } else {
    at::autocast::set_autocast_cpu_dtype(s.dtype);
    at::autocast::set_cpu_enabled(s.enabled);
  }
#endif
}

}  // namespace dsgd::torch_glue
