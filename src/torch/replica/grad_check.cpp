#include "torch/replica/grad_check.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "comm/reduce_kernels.h"
#include "dsgd/torch/activation_checkpoint.h"

namespace dsgd::torch_glue {
namespace {

bool dense_float_cpu(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat32 && t.device().is_cpu() && t.layout() == torch::kStrided &&
         t.is_contiguous();
}

bool finite(const torch::Tensor& t) {
  if (dense_float_cpu(t)) return comm::all_finite(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
  return std::isfinite(t.sum().item<double>());  // other types, devices, layouts: one reduction
}

}  // namespace

GradCheck::GradCheck(std::vector<torch::Tensor> params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    // Captures the index, not the tensor: a tensor in its own hook would never be freed.
    hook_ids_.push_back(params_[i].requires_grad() ? params_[i].register_hook([this, i](const torch::Tensor& grad) {
      return on_grad(i, grad);
    })
                                                   : ~0u);
  }
}

GradCheck::~GradCheck() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (hook_ids_[i] != ~0u) params_[i].remove_hook(hook_ids_[i]);
  }
}

torch::Tensor GradCheck::on_grad(size_t param, const torch::Tensor& grad) {
  if (recomputing_checkpointed_unit()) return grad;  // handed on: it comes here from the outer backward
  auto& held = params_[param].mutable_grad();
  // What AccumulateGrad would do in place (no grad mode, a dense .grad of the same shape), done
  // here with the check; with .grad cleared, AccumulateGrad takes the sum as it is.
  if (held.defined() && !at::GradMode::is_enabled() && !held.requires_grad() && dense_float_cpu(held) &&
      dense_float_cpu(grad) && held.sizes() == grad.sizes()) {
    if (!comm::add_into_finite(held.data_ptr<float>(), grad.data_ptr<float>(), static_cast<size_t>(held.numel()))) {
      finite_ = false;
    }
    torch::Tensor sum = std::move(held);
    held = torch::Tensor();
    return sum;
  }
  if (grad.defined() && !finite(grad)) finite_ = false;
  if (held.defined() && !finite(held)) finite_ = false;  // what it will be added to
  return grad;
}

}  // namespace dsgd::torch_glue
