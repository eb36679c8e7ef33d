// A replica's step times: the live progress its worker's heartbeat reads (steps, loss, seconds a
// step and their split into computing and waiting for communication, which the driver compares
// to find stragglers), and a train() call's profile (each phase's seconds, the values the step's
// mechanics report once a step, the steady step time). A part of ReplicaRuntime (replica.h).
// Torch-free.
//
//   times.begin_call(profile, batches_per_epoch);
//   ... times.step_ended(waited_s, step) after each step ...
//   times.add_means(&metrics, batches);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/torch/metrics.h"

namespace dsgd::torch_glue {

// Live progress, read by the worker's heartbeat thread.
struct ReplicaProgress {
  std::atomic<int64_t> batches{0};
  std::atomic<double> loss{0};
  std::atomic<int64_t> batches_per_epoch{0};  // set as each train() starts
  std::atomic<double> step_s{0};              // recent seconds per step (a moving average; 0: not yet known)
  std::atomic<int64_t> step{0};  // the steps its position in the epochs stands for (epoch x per epoch + batch)
  // Over the replica's life, the steps timed (each but a call's first) and their seconds split
  // into computing (all but the waits) and waiting for communication: the driver compares
  // ranks' compute per step to find stragglers.
  std::atomic<int64_t> timed_steps{0};
  std::atomic<double> compute_s{0};
  std::atomic<double> wait_s{0};
};

class StepTimes {
 public:
  using Clock = std::chrono::steady_clock;

  // A train() call begins: whether it profiles; its phases, values and step ends start afresh.
  void begin_call(bool profile, int64_t batches_per_epoch);
  void end_call() { profiling_ = false; }
  bool profiling() const { return profiling_; }

  void add_phase(const char* name, double seconds) { phase_s_[name] += seconds; }
  // A value the step reports once (e.g. grad_norm): the call's metrics carry its mean.
  void add_value(const std::string& name, double value);
  // Seconds in the forward overlap's gate (profiling).
  void add_gate_wait(double seconds) { gate_s_ += seconds; }
  double gate_seconds() const { return gate_s_; }

  // A step ended now; the replica's gradient syncs have waited `waited_s` in all so far, and its
  // position stands for `step` steps.
  void step_ended(double waited_s, int64_t step);
  // Seconds per step of the call in its steady state: the median time between the ends of
  // consecutive steps, so neither the call's start and end nor one slow step count (0 with
  // fewer than 2 steps).
  double steady_step_seconds() const;
  // Into the call's metrics: each phase's seconds per step over `batches` steps (profiling), and
  // each reported value's mean.
  void add_phase_means(Metrics* m, double batches) const;
  void add_value_means(Metrics* m) const;

  ReplicaProgress& progress() { return progress_; }

 private:
  bool profiling_ = false;
  std::map<std::string, double> phase_s_;
  std::map<std::string, std::pair<double, int64_t>> step_values_;  // sum and count over the call
  double gate_s_ = 0;
  std::vector<Clock::time_point> step_ends_;  // this call's
  double waited_at_last_step_ = 0;            // the syncs' total wait when the last step ended
  ReplicaProgress progress_;
};

}  // namespace dsgd::torch_glue
