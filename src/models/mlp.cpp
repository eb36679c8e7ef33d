// A plain multi-layer perceptron; with the default 784-2048-2048-10 it has 5.8 M parameters and
// little compute per parameter, which makes it our communication-bound benchmark.
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "dsgd/torch/parameter_gate.h"
#include "models/zoo.h"

namespace dsgd::models {
namespace {

class Mlp : public Classifier {
 public:
  explicit Mlp(const ModelOptions& o) {
    int64_t in = o.in_channels * o.image_size * o.image_size;
    for (size_t i = 0; i < o.mlp_hidden.size(); ++i) {
      layers_.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(in, o.mlp_hidden[i])));
      in = o.mlp_hidden[i];
    }
    layers_.push_back(register_module("fc" + std::to_string(o.mlp_hidden.size() + 1),
                                      torch::nn::Linear(in, o.num_classes)));
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = images.flatten(1);
    for (size_t i = 0; i + 1 < layers_.size(); ++i) {
      wait_for_parameters(*layers_[i]);
      x = torch::nn::functional::relu(layers_[i](x));
    }
    wait_for_parameters(*layers_.back());
    return layers_.back()(x);
  }

 private:
  std::vector<torch::nn::Linear> layers_;
};

}  // namespace

std::shared_ptr<Classifier> make_mlp(const ModelOptions& options) { return std::make_shared<Mlp>(options); }

}  // namespace dsgd::models
