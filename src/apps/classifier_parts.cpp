#include "apps/classifier_parts.h"

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>

#include <algorithm>
#include <sstream>

#include "dsgd/common/error.h"
#include "dsgd/models/registry.h"
#include "dsgd/torch/sgd.h"

namespace dsgd::apps {

LossFn classifier_loss(const std::string& name, int64_t classes) {
  namespace F = torch::nn::functional;
  if (name == "nll") {
    return [](const torch::Tensor& out, const torch::Tensor& target) { return F::nll_loss(out, target); };
  }
  if (name == "mse") {
    return [classes](const torch::Tensor& out, const torch::Tensor& target) {
      return F::mse_loss(out, torch::one_hot(target, classes).to(out.scalar_type()));
    };
  }
  if (models::is_model_file(name)) return models::load_scripted_loss(name);
  return cross_entropy_loss();  // validate(LocalJobOptions) let no other name through
}

std::unique_ptr<torch::optim::Optimizer> classifier_optimizer(std::vector<torch::Tensor> params,
                                                              const LocalJobOptions& o) {
  namespace optim = torch::optim;
  const auto betas = std::make_tuple(o.beta1, o.beta2);
  if (o.optimizer == "adam") {
    return std::make_unique<optim::Adam>(
        std::move(params), optim::AdamOptions(o.lr).betas(betas).weight_decay(o.weight_decay.value_or(0.0)));
  }
  if (o.optimizer == "adamw") {
    return std::make_unique<optim::AdamW>(
        std::move(params), optim::AdamWOptions(o.lr).betas(betas).weight_decay(o.weight_decay.value_or(0.01)));
  }
  if (o.optimizer == "rmsprop") {
    return std::make_unique<optim::RMSprop>(
        std::move(params), optim::RMSpropOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay.value_or(0.0)));
  }
  // validate(LocalJobOptions) let no other name through
  return std::make_unique<FusedSGD>(
      std::move(params), optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay.value_or(0.0)));
}

ClassifierData classifier_data(const LocalJobOptions& o, uint64_t seed) {
  ClassifierData d;
  if (o.dataset == "synthetic") {
    const int64_t n_test = std::max<int64_t>(1, o.synthetic_samples / 4);
    auto all = data::make_synthetic({.num_samples = o.synthetic_samples + n_test,
                                     .channels = o.synthetic_channels,
                                     .image_size = o.synthetic_image_size,
                                     .seed = seed});
    d.train_x = all.images().slice(0, 0, o.synthetic_samples).contiguous();
    d.train_y = all.labels().slice(0, 0, o.synthetic_samples).contiguous();
    d.test_x = all.images().slice(0, o.synthetic_samples).contiguous();
    d.test_y = all.labels().slice(0, o.synthetic_samples).contiguous();
    d.num_classes = all.num_classes();
  } else if (o.dataset == "fashion-mnist") {
    auto train = data::load_fashion_mnist(o.data_dir, data::Split::kTrain);
    auto test = data::load_fashion_mnist(o.data_dir, data::Split::kTest);
    d = {train.images(), train.labels(), test.images(), test.labels(), train.num_classes()};
  } else {  // validate(LocalJobOptions) let only a file through
    d = data::load_tensors_file(o.dataset);
  }
  return d;
}

models::ModelOptions classifier_model_options(const LocalJobOptions& o, const ClassifierData& d) {
  models::ModelOptions mo;
  const auto& x = d.train_x;
  if (x.dim() == 4 && x.size(2) == x.size(3)) {
    mo.in_channels = x.size(1);
    mo.image_size = x.size(2);
  } else if (models::is_model_file(o.model)) {
    mo.input_shape = x.sizes().slice(1).vec();
  } else {
    std::ostringstream shape;
    shape << x.sizes();
    throw ConfigError("model '" + o.model + "' takes square images [N, C, H, H]; the data's samples are " +
                      shape.str() + ": train a model of your own on them (a TorchScript file)");
  }
  mo.num_classes = d.num_classes;
  mo.dropout = o.dropout;
  mo.sync_batchnorm = o.sync_batchnorm;
  mo.sim_parameters = o.sim_parameters;
  mo.sim_layers = o.sim_layers;
  mo.sim_step_ms = o.sim_step_ms;
  return mo;
}

void scale_learning_rate(torch::optim::Optimizer& optimizer, double factor) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(group.options().get_lr() * factor);
}

}  // namespace dsgd::apps
