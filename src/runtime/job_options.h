// The reference job's options (model, data, optimizer, schedule), their checks, and the JSON
// config of the built-in image classifier operator. Torch-free: the fuzz target
// tests/fuzz/config_fuzzer.cpp runs these without LibTorch.
//
//   LocalJobOptions o = image_classifier_options(nlohmann::json::parse(R"({"model": "mlp", "lr": 0.1})"));
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsgd::runtime {

struct LocalJobOptions {
  std::string model = "cnn";               // a name from dsgd::models::model_names()
  std::string dataset = "fashion-mnist";   // "fashion-mnist" or "synthetic"
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 1;                      // passes over the training set
  int64_t batch_size = 64;                 // samples per step
  double lr = 0.01;                        // SGD learning rate
  double momentum = 0.9;                   // SGD momentum, in [0, 1)
  double lr_decay = 1.0;                   // learning rate x this after every epoch, in (0, 1]
  uint64_t seed = 1;                       // initial weights and shuffling
  int threads = 1;                         // LibTorch intra-op (and OpenMP/OpenBLAS) threads
  int64_t max_steps = 0;                   // > 0: stop after this many steps in all (benchmarks)
  bool evaluate = true;                    // evaluate on the test split after each epoch
  bool dropout = true;                     // false: dropout layers become identities
  int64_t synthetic_samples = 8192;        // dataset "synthetic": training samples (test: 1/4)
  int64_t synthetic_image_size = 28;       // dataset "synthetic": side in pixels (1 channel)
  int64_t sim_parameters = 1'000'000;      // model "simulated" (dsgd/models.h): gradient elements,
  int64_t sim_layers = 8;                  //   in this many tensors,
  double sim_step_ms = 50;                 //   forward + backward time per step (slept, not computed)
};

// Throws dsgd::ConfigError naming the first bad field, its value and the accepted range.
void validate(const LocalJobOptions& options);

// JSON text given as a config (`what` names it in messages: "--config"): the parsed value, or a
// ConfigError for anything the JSON parser rejects (syntax, numbers out of range, bad UTF-8).
nlohmann::json parse_config_text(std::string_view text, const std::string& what);

// The image classifier's config (keys: model, dataset, data_dir, lr, momentum, lr_decay,
// dropout, synthetic_samples, synthetic_image_size, sim_parameters, sim_layers, sim_step_ms)
// over the defaults, validated. ConfigError for anything else: not an object, an unknown key, a
// value of the wrong type or out of range.
LocalJobOptions image_classifier_options(const nlohmann::json& config);

}  // namespace dsgd::runtime
