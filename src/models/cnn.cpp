// The classic PyTorch MNIST example network (pytorch/examples mnist/main.py).
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include "dsgd/torch/parameter_gate.h"
#include "models/zoo.h"

namespace dsgd::models {
namespace {

namespace F = torch::nn::functional;

class Cnn : public Classifier {
 public:
  explicit Cnn(const ModelOptions& o) : channels_last_(o.channels_last) {
    const int64_t side = (o.image_size - 4) / 2;  // two valid 3x3 convolutions, then a 2x2 pool
    conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels, 32, 3)));
    conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
    dropout1_ = register_module("dropout1", torch::nn::Dropout(o.dropout ? 0.25 : 0.0));
    fc1_ = register_module("fc1", torch::nn::Linear(64 * side * side, 128));
    dropout2_ = register_module("dropout2", torch::nn::Dropout(o.dropout ? 0.5 : 0.0));
    fc2_ = register_module("fc2", torch::nn::Linear(128, o.num_classes));
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    wait_for_parameters(*conv1_);
    auto x = F::relu(conv1_(images_for(images, channels_last_)));
    wait_for_parameters(*conv2_);
    x = F::relu(conv2_(x));
    x = dropout1_(F::max_pool2d(x, F::MaxPool2dFuncOptions(2)));
    wait_for_parameters(*fc1_);
    x = dropout2_(F::relu(fc1_(x.flatten(1))));
    wait_for_parameters(*fc2_);
    return fc2_(x);
  }

 private:
  bool channels_last_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Dropout dropout1_{nullptr}, dropout2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_cnn(const ModelOptions& options) { return std::make_shared<Cnn>(options); }

}  // namespace dsgd::models
