// The image classifier's parts by name (LocalJobOptions: loss, optimizer and its settings, data),
// for the distributed operator and the single-process job alike.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsgd/data/datasets.h"
#include "dsgd/apps/local_job.h"
#include "dsgd/models/registry.h"
#include "dsgd/torch/operator.h"

namespace dsgd::apps {

// o.dataset's training and test splits. The synthetic dataset is drawn once from `seed` and
// split 4:1, so both splits share its teacher; a tensors file may have no test split (undefined
// tensors).
using ClassifierData = data::TensorData;
ClassifierData classifier_data(const LocalJobOptions& o, uint64_t seed);

// The model's options for data `d`: a reference model takes square images [N, C, H, H]; a model
// file any sample shape. ConfigError for a reference model on other data.
models::ModelOptions classifier_model_options(const LocalJobOptions& o, const ClassifierData& d);

// "cross_entropy" (logits), "nll" (log-probabilities), "mse" (logits against one-hot targets of
// `classes`), or a TorchScript file's forward(output, target). The batch's mean.
LossFn classifier_loss(const std::string& name, int64_t classes);

// o.optimizer over `params`: "sgd" (dsgd::FusedSGD: lr, momentum), "adam" or "adamw" (lr, beta1,
// beta2), "rmsprop" (lr, momentum; alpha 0.99); weight_decay where set, else PyTorch's default
// (0; AdamW 0.01).
std::unique_ptr<torch::optim::Optimizer> classifier_optimizer(std::vector<torch::Tensor> params,
                                                              const LocalJobOptions& o);

// Every optimizer's learning rate times `factor` (lr_decay after an epoch).
void scale_learning_rate(torch::optim::Optimizer& optimizer, double factor);

}  // namespace dsgd::apps
