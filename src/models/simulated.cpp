// Simulated compute, for cluster benchmarks past what this machine can compute (bench/cluster.sh):
// forward and backward sleep for a given time instead of computing (on a schedule: paced_sleep.h),
// and backward hands out gradients of the given size layer by layer, last layer first, as a real
// network's would, each layer a matrix as near square as its size allows. The communication is
// real; the compute is a model of it, costing no CPU.
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>

#include <cmath>

#include "dsgd/torch/parameter_gate.h"
#include "models/paced_sleep.h"
#include "models/zoo.h"

namespace dsgd::models {
namespace {

// Each thread keeps its own schedule: a worker's replicas train on threads of their own.
void sleep_ms(double ms) {
  thread_local PacedSleep pace;
  pace.sleep(ms);
}

// y = x after forward_ms; backward: dL/dx = dL/dy, and dL/dw a constant tensor (from the mean
// of dL/dy, so it is cheap) after backward_ms.
struct SleepLayer : torch::autograd::Function<SleepLayer> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               double forward_ms, double backward_ms) {
    ctx->save_for_backward({w});
    ctx->saved_data["backward_ms"] = backward_ms;
    sleep_ms(forward_ms);
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    sleep_ms(ctx->saved_data["backward_ms"].toDouble());
    const auto w = ctx->get_saved_variables()[0];
    auto dw = torch::full_like(w, grad[0].mean().item<float>() * 1e-3F);
    return {grad[0], dw, torch::Tensor(), torch::Tensor()};
  }
};

class Simulated : public Classifier {
 public:
  explicit Simulated(const ModelOptions& o)
      : forward_ms_(o.sim_step_ms / 3 / static_cast<double>(o.sim_layers)),
        backward_ms_(o.sim_step_ms * 2 / 3 / static_cast<double>(o.sim_layers)) {
    for (int64_t l = 0; l < o.sim_layers; ++l) {
      const int64_t n = o.sim_parameters / o.sim_layers + (l < o.sim_parameters % o.sim_layers ? 1 : 0);
      // A matrix as near square as n allows (what gradient compression sees of a real layer).
      int64_t rows = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
      while (rows > 1 && n % rows != 0) --rows;
      layers_.push_back(register_parameter("layer" + std::to_string(l + 1),
                                           rows > 1 ? torch::zeros({rows, n / rows}) : torch::zeros({n})));
    }
    head_ = register_module("head", torch::nn::Linear(o.in_channels * o.image_size * o.image_size, o.num_classes));
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = images.flatten(1);
    for (const auto& w : layers_) {
      wait_for_parameters(w);
      x = SleepLayer::apply(x, w, forward_ms_, backward_ms_);
    }
    wait_for_parameters(*head_);
    return head_(x);
  }

 private:
  double forward_ms_, backward_ms_;
  std::vector<torch::Tensor> layers_;
  torch::nn::Linear head_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_simulated(const ModelOptions& options) {
  return std::make_shared<Simulated>(options);
}

}  // namespace dsgd::models
