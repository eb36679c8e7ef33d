// dsgd/apps/local_job.h — a whole training job in this process, with no workers: the single-process
// baseline that the distributed runtime is measured against (`dsgd train --in-process`).
//
//   dsgd::LocalJobOptions o;  o.model = "cnn";  o.epochs = 5;  o.threads = 2;
//   dsgd::LocalJobResult r = dsgd::run_local_job(o, &my_listener);
//   std::cout << r.test_accuracy;
//
// The options also describe the built-in image classifier's job for the Trainer
// (dsgd/apps/image_classifier.h). Torch-free header. run_local_job throws dsgd::ConfigError for bad
// options (before loading anything) and dsgd::DataError for bad data files. It reports in
// dsgd::fit's types (dsgd/runtime/fit.h), so one listener follows either kind of job.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsgd/runtime/fit.h"

namespace dsgd {

struct LocalJobOptions {
  std::string model = "cnn";               // a name from dsgd::models::model_names(), or a TorchScript file
  // cross_entropy (on logits), nll (on log-probabilities), mse (logits against one-hot targets), or
  // a TorchScript file whose forward(output, target) returns the loss (dsgd/models/registry.h: load_scripted_loss)
  std::string loss = "cross_entropy";
  // "fashion-mnist", "synthetic", or a file of tensors (ends in .pt or holds a '/'; dsgd/data/datasets.h:
  // load_tensors_file)
  std::string dataset = "fashion-mnist";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 1;                      // passes over the training set
  int64_t batch_size = 64;                 // samples per step
  std::string optimizer = "sgd";           // "sgd" (with momentum), "adam", "adamw", "rmsprop"
  double lr = 0.01;                        // learning rate
  double momentum = 0.9;                   // SGD's momentum, in [0, 1)
  std::optional<double> weight_decay;      // unset: PyTorch's default (0; AdamW 0.01)
  double beta1 = 0.9;                      // Adam's and AdamW's betas, in [0, 1)
  double beta2 = 0.999;
  double lr_decay = 1.0;                   // learning rate x this after every epoch, in (0, 1]
  uint64_t seed = 1;                       // initial weights and shuffling
  int threads = 1;                         // LibTorch intra-op (and OpenMP/OpenBLAS) threads
  int64_t max_steps = 0;                   // > 0: stop after this many steps in all (benchmarks)
  bool evaluate = true;                    // evaluate on the test split after each epoch
  bool dropout = true;                     // false: dropout layers become identities
  std::optional<bool> channels_last;       // cnn, resnets (dsgd/models/registry.h); unset: on a GPU only
  bool sync_batchnorm = false;             // resnets: BatchNorm over the global batch (dsgd/torch/sync_batchnorm.h)
  bool cudnn_benchmark = true;             // on a GPU: cuDNN times its algorithms per input shape
                                           //   and keeps the fastest (false: its default choice)
  int64_t synthetic_samples = 8192;        // dataset "synthetic": training samples (test: 1/4)
  int64_t synthetic_image_size = 28;       // dataset "synthetic": side in pixels
  int64_t synthetic_channels = 1;          // dataset "synthetic": channels (3 for ImageNet-shaped inputs)
  int64_t sim_parameters = 1'000'000;      // model "simulated" (dsgd/models/registry.h): gradient elements,
  int64_t sim_layers = 8;                  //   in this many tensors,
  double sim_step_ms = 50;                 //   forward + backward time per step (slept, not computed)
};

// Throws dsgd::ConfigError naming the first bad field, its value and the accepted range.
void validate(const LocalJobOptions& options);

// JSON text given as a config (`what` names it in messages: "--config"): the parsed value, or a
// ConfigError for anything the JSON parser rejects (syntax, numbers out of range, bad UTF-8).
nlohmann::json parse_config_text(std::string_view text, const std::string& what);

// The job's results and progress, in dsgd::fit's types (dsgd/runtime/fit.h).
using LocalJobResult = FitResult;

LocalJobResult run_local_job(const LocalJobOptions& options, ProgressListener* listener = nullptr);

}  // namespace dsgd
