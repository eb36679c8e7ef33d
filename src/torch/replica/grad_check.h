// A lone replica's NaN check, at no extra pass over memory. With more replicas GradSync checks
// each gradient as it copies it into its bucket; a lone replica has no GradSync (nothing to
// average), and a second read of every .grad before the optimizer step cost the MLP (23 MB of
// gradients) 3% of its step, more with the cache it evicted.
//
//   GradCheck check(model->parameters());
//   optimizer.zero_grad();
//   loss.backward();
//   if (check.take()) optimizer.step();
//
// A hook per parameter does AccumulateGrad's work itself where .grad is a float32 CPU tensor
// (.grad += gradient, as LibTorch would, in place) and checks the sum in the same pass; LibTorch
// then takes that sum as .grad without a copy. So .grad holds what it would without the check,
// gradients accumulate over backwards as usual, and what is checked is .grad after each backward
// (gradients not accumulated into a float32 CPU .grad are read once more). Changes made to .grad
// after backward are not checked.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <utility>
#include <vector>

namespace dsgd::torch_glue {

class GradCheck {
 public:
  explicit GradCheck(std::vector<torch::Tensor> params);
  ~GradCheck();  // removes the hooks
  GradCheck(const GradCheck&) = delete;
  GradCheck& operator=(const GradCheck&) = delete;

  // Whether every gradient since the last call was finite; starts over.
  bool take() { return finite_.exchange(true); }

 private:
  torch::Tensor on_grad(size_t param, const torch::Tensor& grad);

  std::vector<torch::Tensor> params_;
  std::vector<unsigned> hook_ids_;  // per parameter
  std::atomic<bool> finite_{true};
};

}  // namespace dsgd::torch_glue
