// A whole training job in this process: load data, build the model, train with SGD, evaluate.
//
//   dsgd::runtime::LocalJobOptions o;  o.model = "cnn";  o.epochs = 5;  o.threads = 2;
//   dsgd::runtime::LocalJobResult r = dsgd::runtime::run_local_job(o, &my_listener);
//   std::cout << r.test_accuracy;
//
// This is what `dsgd train --workers 1` runs and the single-process baseline the distributed
// runtime is measured against. Torch-free header. run_local_job throws dsgd::ConfigError for bad
// options (before loading anything) and dsgd::DataError for bad data files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/job_options.h"

namespace dsgd::runtime {

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

}  // namespace dsgd::runtime
