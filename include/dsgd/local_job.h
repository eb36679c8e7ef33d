// dsgd/local_job.h — a whole training job in this process, with no workers: the single-process
// baseline that the distributed runtime is measured against (`dsgd train --in-process`).
//
//   dsgd::LocalJobOptions o;  o.model = "cnn";  o.epochs = 5;  o.threads = 2;
//   dsgd::LocalJobResult r = dsgd::run_local_job(o, &my_listener);
//   std::cout << r.test_accuracy;
//
// The options also describe the built-in image classifier's job for the Trainer
// (dsgd/image_classifier.h). Torch-free header. run_local_job throws dsgd::ConfigError for bad
// options (before loading anything) and dsgd::DataError for bad data files.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsgd {

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
  std::optional<bool> channels_last;       // cnn, resnets (dsgd/models.h); unset: on a GPU only
  bool cudnn_benchmark = true;             // on a GPU: cuDNN times its algorithms per input shape
                                           //   and keeps the fastest (false: its default choice)
  int64_t synthetic_samples = 8192;        // dataset "synthetic": training samples (test: 1/4)
  int64_t synthetic_image_size = 28;       // dataset "synthetic": side in pixels
  int64_t synthetic_channels = 1;          // dataset "synthetic": channels (3 for ImageNet-shaped inputs)
  int64_t sim_parameters = 1'000'000;      // model "simulated" (dsgd/models.h): gradient elements,
  int64_t sim_layers = 8;                  //   in this many tensors,
  double sim_step_ms = 50;                 //   forward + backward time per step (slept, not computed)
};

// Throws dsgd::ConfigError naming the first bad field, its value and the accepted range.
void validate(const LocalJobOptions& options);

// JSON text given as a config (`what` names it in messages: "--config"): the parsed value, or a
// ConfigError for anything the JSON parser rejects (syntax, numbers out of range, bad UTF-8).
nlohmann::json parse_config_text(std::string_view text, const std::string& what);

struct BatchProgress {
  int64_t epoch = 0;              // 1-based
  int64_t epochs = 0;
  int64_t batch = 0;              // 1-based, within the epoch
  int64_t batches_per_epoch = 0;
  int64_t step = 0;               // 1-based, over the whole job
  int64_t total_steps = 0;
  double loss = 0;                // this batch's mean loss
  double samples_per_s = 0;       // training throughput so far
  double elapsed_s = 0;           // training time so far (excludes loading and evaluation)
};

struct EpochSummary {
  int64_t epoch = 0;
  double train_loss = 0;          // mean over the epoch's samples
  double test_loss = -1;          // -1 when not evaluated
  double test_accuracy = -1;      // fraction in [0, 1]; -1 when not evaluated
  double samples_per_s = 0;
  double epoch_s = 0;             // training time of this epoch
  int64_t recoveries = 0;         // lost workers survived during the epoch (worker jobs)
  // With `dsgd train --profile`: milliseconds per step of each phase of the default train_batch,
  // each its own work only, mean over workers (TrainOptions::profile's keys, "_s" dropped:
  // forward, backward, optimizer, comm_wait), and step, the whole step. Empty otherwise.
  std::map<std::string, double> profile_ms;
};

struct LocalJobResult {
  double train_loss = 0;          // last epoch's mean training loss
  double test_loss = -1;          // after the last epoch; -1 when not evaluated
  double test_accuracy = -1;
  int64_t epochs = 0;             // epochs started (the last may be partial with max_steps)
  int64_t steps = 0;
  int64_t samples = 0;            // training samples processed
  double samples_per_s = 0;       // samples / train_s
  double train_s = 0;             // time in training steps
  double wall_s = 0;              // everything: loading, training, evaluation
  int64_t parameters = 0;
  // Worker jobs whose strategy counts them (allreduce): bytes each replica sent to other hosts
  // per step, mean over replicas and steps; -1: not counted.
  double comm_bytes_per_step = -1;
  std::vector<EpochSummary> history;
  std::map<std::string, double> profile_ms;  // as EpochSummary's, over the run (by steps)
};

// Receives progress; called on the training thread, so keep it cheap.
class ProgressListener {
 public:
  virtual ~ProgressListener() = default;
  virtual void on_batch(const BatchProgress& /*progress*/) {}
  virtual void on_epoch(const EpochSummary& /*summary*/) {}
};

LocalJobResult run_local_job(const LocalJobOptions& options, ProgressListener* listener = nullptr);

}  // namespace dsgd
