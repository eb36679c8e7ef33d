// ResNet-18 and ResNet-50 with torchvision's layout and parameter names (conv1, bn1,
// layer1.0.conv1, ..., fc), so state dicts line up with torchvision's.
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "dsgd/torch/activation_checkpoint.h"
#include "dsgd/torch/parameter_gate.h"
#include "dsgd/torch/sync_batchnorm.h"
#include "models/zoo.h"

namespace dsgd::models {
namespace {

namespace F = torch::nn::functional;
namespace nn = torch::nn;

// BatchNorm2d, over the global batch with ModelOptions::sync_batchnorm (the same names either way).
SyncBatchNorm2d norm(int64_t channels, bool sync) { return SyncBatchNorm2d(nn::BatchNormOptions(channels), sync); }

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

class ResidualBlock : public nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;

 protected:
  // Projection shortcut when the shape changes, as in torchvision: 1x1 conv + batch norm.
  void make_downsample(int64_t in, int64_t out, int64_t stride, bool sync) {
    if (stride == 1 && in == out) return;
    downsample_ = register_module("downsample", nn::Sequential(conv(in, out, 1, stride), norm(out, sync)));
  }
  torch::Tensor shortcut(const torch::Tensor& x) { return downsample_ ? downsample_->forward(x) : x; }

 private:
  nn::Sequential downsample_{nullptr};
};

class BasicBlock : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride, bool sync)
      : conv1_(register_module("conv1", conv(in, planes, 3, stride))),
        bn1_(register_module("bn1", norm(planes, sync))),
        conv2_(register_module("conv2", conv(planes, planes, 3, 1))),
        bn2_(register_module("bn2", norm(planes, sync))) {
    make_downsample(in, planes * kExpansion, stride, sync);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = F::relu(bn1_(conv1_(x)));
    y = bn2_(conv2_(y));
    return F::relu(y + shortcut(x));
  }

 private:
  nn::Conv2d conv1_;
  SyncBatchNorm2d bn1_;
  nn::Conv2d conv2_;
  SyncBatchNorm2d bn2_;
};

class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride, bool sync)
      : conv1_(register_module("conv1", conv(in, planes, 1, 1))),
        bn1_(register_module("bn1", norm(planes, sync))),
        conv2_(register_module("conv2", conv(planes, planes, 3, stride))),
        bn2_(register_module("bn2", norm(planes, sync))),
        conv3_(register_module("conv3", conv(planes, planes * kExpansion, 1, 1))),
        bn3_(register_module("bn3", norm(planes * kExpansion, sync))) {
    make_downsample(in, planes * kExpansion, stride, sync);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = F::relu(bn1_(conv1_(x)));
    y = F::relu(bn2_(conv2_(y)));
    y = bn3_(conv3_(y));
    return F::relu(y + shortcut(x));
  }

 private:
  nn::Conv2d conv1_;
  SyncBatchNorm2d bn1_;
  nn::Conv2d conv2_;
  SyncBatchNorm2d bn2_;
  nn::Conv2d conv3_;
  SyncBatchNorm2d bn3_;
};

class ResNet : public Classifier {
 public:
  template <typename B>
  ResNet(B* /*tag*/, const std::array<int, 4>& blocks, const ModelOptions& o)
      : imagenet_stem_(o.image_size >= 64), channels_last_(o.channels_last) {
    conv1_ = register_module("conv1", imagenet_stem_ ? conv(o.in_channels, 64, 7, 2) : conv(o.in_channels, 64, 3, 1));
    bn1_ = register_module("bn1", norm(64, o.sync_batchnorm));
    int64_t in = 64;
    for (int l = 0; l < 4; ++l) {
      const int64_t planes = int64_t{64} << l;
      auto list = register_module("layer" + std::to_string(l + 1), nn::ModuleList());
      for (int b = 0; b < blocks[l]; ++b) {
        auto block = std::make_shared<B>(in, planes, (b == 0 && l > 0) ? 2 : 1, o.sync_batchnorm);
        list->push_back(block);
        blocks_.push_back(block);
        in = planes * B::kExpansion;
      }
    }
    fc_ = register_module("fc", nn::Linear(in, o.num_classes));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<nn::Conv2d>()) {
        nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
      }
    }
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    wait_for_parameters(*conv1_);
    wait_for_parameters(*bn1_);
    auto x = F::relu(bn1_(conv1_(images_for(images, channels_last_))));
    if (imagenet_stem_) x = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    for (auto& block : blocks_) {
      wait_for_parameters(*block);  // a block at a time
      auto* b = block.get();          // checkpointed: step.activation_checkpointing
      x = run_checkpointed(*block, x, [b](const torch::Tensor& in) { return b->forward(in); });
    }
    x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    wait_for_parameters(*fc_);
    return fc_(x);
  }

 private:
  bool imagenet_stem_;
  bool channels_last_;
  nn::Conv2d conv1_{nullptr};
  SyncBatchNorm2d bn1_{nullptr};
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
  nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_resnet(int depth, const ModelOptions& o) {
  if (depth == 18)
    return std::make_shared<ResNet>(static_cast<BasicBlock*>(nullptr), std::array<int, 4>{2, 2, 2, 2}, o);
  return std::make_shared<ResNet>(static_cast<Bottleneck*>(nullptr), std::array<int, 4>{3, 4, 6, 3}, o);
}

}  // namespace dsgd::models
