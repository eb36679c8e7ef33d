// dsgd/runtime/evaluator.h — TensorFlow's evaluator role: a process of its own, on any host that sees a
// job's checkpoint directory (TrainerConfig::checkpoints.dir), that evaluates each checkpoint as it
// appears while the job trains; the job never waits for it. `dsgd evaluate` is this.
//
//   dsgd::EvaluatorArgs a{.checkpoint_dir = "ckpts", .metrics_out = "eval.jsonl"};
//   return dsgd::run_evaluator(a);           // the process's exit code
//
// Each checkpoint carries its operator's name and config, so the evaluator builds the same
// models without being told; it runs the operator's validate() on the CPU and appends one JSON
// line per checkpoint to `metrics_out` ({"step", "epoch", "checkpoint", "metrics", "unix_s"}) and
// one row to `metrics_out`.csv (step, then each metric: for plotting). It stops once the job
// has ended (its driver marks the directory when it shuts down) and every checkpoint written
// before is evaluated. Torch-free header.
#pragma once

#include <chrono>
#include <string>

namespace dsgd {

struct EvaluatorArgs {
  std::string checkpoint_dir;                       // the job's TrainerConfig::checkpoints.dir
  std::string metrics_out;                          // JSON lines (and <metrics_out>.csv); "" = none
  int threads = 1;                                  // LibTorch threads (beside a job on the host)
  std::chrono::milliseconds poll{500};              // how often to look for a new checkpoint
  std::chrono::milliseconds idle_timeout{3600000};  // no new checkpoint nor the job's end this long: exit 3
};

// Evaluates checkpoints until the job ends; returns the exit code: 0 when the job ended, 1 when
// a checkpoint cannot be evaluated (another operator than this binary registers), 2 for bad
// arguments, 3 after idle_timeout.
int run_evaluator(const EvaluatorArgs& args);

}  // namespace dsgd
