#include "apps/classifier_loss.h"

#include <torch/nn/functional/loss.h>

#include "dsgd/models.h"

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

}  // namespace dsgd::apps
