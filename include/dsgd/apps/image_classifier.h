// dsgd/apps/image_classifier.h — the operator compiled into every dsgd binary, so that `dsgd train`
// and `dsgd worker` need no user code: a reference model (cnn, mlp, resnet18, resnet50,
// simulated) or a TorchScript file, on Fashion-MNIST, synthetic images or tensors from a file,
// SGD with momentum (or Adam, AdamW), a loss by name (cross-entropy by default) or from a
// TorchScript file, the learning rate times lr_decay after every epoch.
//
//   dsgd::register_builtin_operators();
//   dsgd::Trainer trainer(dsgd::kImageClassifier, {.num_workers = 2, .config = {{"model", "mlp"}}});
//
// Its config (TrainerConfig::config, `dsgd train --config`) is a JSON object with the keys of
// image_classifier_options below; an unknown key is an error (a typo must not silently train
// something else). Torch-free header.
#pragma once

#include <nlohmann/json.hpp>

#include "dsgd/apps/local_job.h"

namespace dsgd {

inline constexpr const char* kImageClassifier = "dsgd.ImageClassifier";

// Registers the built-in operators (idempotent).
void register_builtin_operators();

// The image classifier's config (keys: model, loss, dataset, data_dir, optimizer, lr, momentum,
// weight_decay, beta1, beta2, lr_decay, dropout, channels_last, sync_batchnorm, cudnn_benchmark,
// synthetic_samples, synthetic_image_size, synthetic_channels, sim_parameters, sim_layers,
// sim_step_ms) over the defaults, validated. ConfigError for anything else: not an object, an
// unknown key, a value of the wrong type or out of range.
LocalJobOptions image_classifier_options(const nlohmann::json& config);

}  // namespace dsgd
