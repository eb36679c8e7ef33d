// dsgd/runtime/fit.h — the epoch loop every front end runs over a Trainer: train an epoch, evaluate,
// report, until the epochs (or a step budget) are done. `dsgd train` uses it; so can any
// program, and the single-process job (dsgd/apps/local_job.h) reports in the same types.
//
//   dsgd::Trainer trainer(dsgd::operator_of<MyOperator>(), config);
//   dsgd::FitResult r = dsgd::fit(trainer, {.epochs = 5}, &my_listener);
//   std::cout << r.test_accuracy << " after " << r.steps << " steps\n";
//
// Progress goes to a ProgressListener on the calling thread: each batch (through the Trainer's
// on_progress, which fit sets for the call and restores after), each recovery, each epoch.
// Throws what the Trainer's calls throw. Torch-free header.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsgd/runtime/trainer.h"

namespace dsgd {

struct BatchProgress {
  int64_t epoch = 0;  // 1-based
  int64_t epochs = 0;
  int64_t batch = 0;  // 1-based, within the epoch
  int64_t batches_per_epoch = 0;
  int64_t step = 0;  // 1-based, over the whole job
  int64_t total_steps = 0;
  double loss = 0;           // this batch's mean loss
  double samples_per_s = 0;  // training throughput so far
  double elapsed_s = 0;      // training time so far (excludes loading and evaluation)
  std::vector<Straggler> stragglers;  // the workers slow now
};

struct EpochSummary {
  int64_t epoch = 0;
  double train_loss = 0;      // mean over the epoch's samples
  double test_loss = -1;      // -1 when not evaluated
  double test_accuracy = -1;  // fraction in [0, 1]; -1 when not evaluated
  double samples_per_s = 0;
  double epoch_s = 0;      // training time of this epoch
  int64_t recoveries = 0;  // lost workers survived during the epoch (worker jobs)
  // With FitOptions::profile: milliseconds per step of each phase of the default train_batch,
  // each its own work only, mean over workers (TrainOptions::profile's keys, "_s" dropped:
  // forward, backward, optimizer, comm_wait), the driver's snapshot, other (the rest) and step,
  // the whole step. Empty otherwise.
  std::map<std::string, double> profile_ms;
};

struct FitResult {
  double train_loss = 0;  // last epoch's mean training loss
  double test_loss = -1;  // after the last epoch; -1 when not evaluated
  double test_accuracy = -1;
  int64_t epochs = 0;  // epochs started (the last may be partial with max_steps)
  int64_t steps = 0;
  int64_t samples = 0;       // training samples processed
  double samples_per_s = 0;  // samples / train_s
  double train_s = 0;        // time in training steps
  double wall_s = 0;         // everything: loading, training, evaluation
  int64_t parameters = 0;
  // Worker jobs whose strategy counts them (allreduce, ps): bytes each replica sent to other
  // hosts per step, mean over replicas and steps; -1: not counted.
  double comm_bytes_per_step = -1;
  // Worker jobs: the largest peak resident memory (VmHWM) of any worker process, MiB; 0: unknown.
  double worker_peak_rss_mib = 0;
  // Worker jobs: bytes each replica's models (parameters and buffers), optimizers and gradients
  // hold (mean over the replicas, as the last call left them; step.zero_stage shards the last
  // two); 0: unknown. Before the first step the driver checks their estimate against the
  // machine's memory (launch.memory_mib).
  double parameter_bytes = 0, optimizer_state_bytes = 0, gradient_bytes = 0;
  std::vector<EpochSummary> history;
  std::map<std::string, double> profile_ms;  // as EpochSummary's, over the run (by steps)
  std::vector<RecoveryEvent> recoveries;     // every failure survived and scale-up, in order
  std::vector<Straggler> stragglers;         // every worker named one, in order (Results')
  int checkpoint_failures = 0;               // checkpoints.dir writes that failed (Results')
  std::vector<double> checkpoint_waits_s;    // training's wait for each checkpoint (Results')
  int checkpoints_behind = 0;                // of those, the ones that waited for the last write
  bool control_tls = false;                  // the control plane ran over mutual TLS (Trainer::tls)
  bool interrupted = false;                  // FitOptions::stop ended the job early
};

// Receives progress; called on the training thread, so keep it cheap.
class ProgressListener {
 public:
  virtual ~ProgressListener() = default;
  virtual void on_batch(const BatchProgress& /*progress*/) {}
  virtual void on_epoch(const EpochSummary& /*summary*/) {}
  // A recovery started (resumed_at unset), training resumed, or the job scaled back up.
  virtual void on_recovery(const RecoveryEvent& /*event*/) {}
};

struct FitOptions {
  // Epochs to train, from where the Trainer is (load() first to resume). A Trainer that took a
  // lost driver's job up (Trainer::restarted_at) goes on with the job's: epochs and max_steps
  // count from the job's start, and FitResult::steps includes the steps trained before.
  int64_t epochs = 1;
  int64_t max_steps = 0;  // > 0: stop after this many steps in all
  bool evaluate = true;   // Trainer::validate after each epoch (test_loss, test_accuracy)
  bool profile = false;   // TrainOptions::profile, and profile_ms in the results
  // Non-empty: a Chrome trace of each epoch (TrainOptions::trace_path): this path for a single
  // epoch, else "-epoch<N>" before its extension (trace.json -> trace-epoch1.json).
  std::string trace_path;
  // Asked at every progress tick (~10x/s) and before each epoch: true stops the job where it is
  // (Ctrl-C in `dsgd train`). fit returns what was done, interrupted set: the steps so far, the
  // recoveries that completed; the call in progress is cut short, so destroy the Trainer after.
  std::function<bool()> stop;
};

FitResult fit(Trainer& trainer, const FitOptions& options = {}, ProgressListener* listener = nullptr);

// The run as JSON, as `dsgd train` prints it (it adds the job's settings) and dsgd.Trainer.fit
// returns it: the result's figures, "history" (one object per epoch), "recoveries" and
// "stragglers" (rank, host, pid, slowdown, from_step, to_step); "interrupted": true when stopped.
nlohmann::json to_json(const FitResult& result);
// One recovery or scale-up: kind, failure, lost, at_step, rolled_back_steps, from_peer, detect_s,
// recovery_s, caught_up_s, workers_after, standbys_used, phases_s and resumed_at_unix_s (when training
// resumed, for scripts that time a fault themselves).
nlohmann::json to_json(const RecoveryEvent& event);
nlohmann::json to_json(const Straggler& straggler);

// FitOptions::trace_path's file for `epoch` of `epochs`.
std::string trace_path_of(const std::string& path, int64_t epoch, int64_t epochs);

}  // namespace dsgd
