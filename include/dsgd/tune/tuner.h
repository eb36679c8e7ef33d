// dsgd/tune/tuner.h — hyper-parameter search: many Trainer jobs over a search space, bad ones stopped
// early (ASHA) or replaced by perturbed copies of good ones (PBT). Ray Tune's role for
// TorchTrainer, in C++.
//
//   auto space = dsgd::SearchSpace::parse(R"({"lr": {"loguniform": [0.005, 0.2]},
//                                             "momentum": {"uniform": [0.5, 0.95]},
//                                             "batch_size": {"choice": [32, 64, 128]}})", "space");
//   dsgd::TuneOptions o{.dir = "tune-cnn", .num_trials = 12, .scheduler = "asha", .max_iterations = 6};
//   dsgd::Tuner tuner(dsgd::kImageClassifier, base_config, space, o);
//   dsgd::TuneResult r = tuner.run();          // r.trials[r.best].params, its checkpoint
//
// A trial is one Trainer job (with its own workers) on `base_config` with the trial's sampled
// values: a key naming a tunable setting (trainer_fields(): its path, "comm.compression", or
// its last part where that is unambiguous, "compression") sets that field, any other key
// the operator's config (TrainerConfig::config). An iteration is one train() call (an epoch, or
// steps_per_iteration steps) and one validate(); the trial reports the validation's metrics
// as "test_<name>" and the training's as "train_<name>" (the image classifier: test_accuracy,
// test_loss, train_loss), and saves a checkpoint. As many trials run at once as `cores` allow
// (each takes num_workers x threads_per_worker cores; never more in all).
//
// Schedulers: "fifo" runs every trial to max_iterations. "asha" (Li et al., 2018, asynchronous
// successive halving): rungs at grace_period x reduction_factor^k iterations; a trial reaching
// a rung goes on only if its metric is in the best 1/reduction_factor of those recorded at that
// rung so far. "pbt" (Jaderberg et al., 2017): every trial alive at once, in rounds of one
// iteration; every perturbation_interval iterations a trial in the worst `quantile` takes the
// checkpoint and values of one in the best `quantile` (exploit) and perturbs each value
// (explore: numbers times 0.8 or 1.2 within their range, a choice its neighbour, or a new draw
// with resample_probability).
//
// Everything lives in `dir`: tune.json (the search and every trial's state and history, written
// after every report), and trial-<id>/ (its last checkpoint). run() on a dir that holds the same
// search resumes it: trials that ended are not run again, a trial cut off mid-way goes on from its
// last checkpoint (fifo, asha; pbt starts its round again). A dir holding another search is a
// ConfigError. Torch-free header.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dsgd/runtime/trainer.h"

namespace dsgd {

// One key's values: a constant, or {"choice": [...]}, {"grid": [...]}, {"uniform": [lo, hi]},
// {"loguniform": [lo, hi]} (0 < lo), {"randint": [lo, hi]} (integers lo..hi).
struct Domain {
  enum class Kind { kConstant, kChoice, kGrid, kUniform, kLogUniform, kRandInt };
  Kind kind = Kind::kConstant;
  nlohmann::json values;  // constant: the value; choice, grid: the list
  double lo = 0, hi = 0;  // uniform, loguniform, randint
};

class SearchSpace {
 public:
  // ConfigError naming `what`, the key and the problem: not an object, empty, an unknown
  // distribution, bounds out of order, an empty list.
  static SearchSpace parse(const std::string& json_text, const std::string& what);
  static SearchSpace from_json(const nlohmann::json& space, const std::string& what);

  const std::vector<std::pair<std::string, Domain>>& domains() const { return domains_; }
  // Points of the grid (the product of every grid key's list; 1 without grid keys).
  size_t grid_points() const;
  // Trial values: grid point `grid_index` (mod grid_points()) with every other domain drawn.
  nlohmann::json sample(size_t grid_index, std::mt19937_64& gen) const;
  // PBT's explore step on `values`.
  nlohmann::json perturb(const nlohmann::json& values, double resample_probability, std::mt19937_64& gen) const;
  nlohmann::json to_json() const { return source_; }

 private:
  std::vector<std::pair<std::string, Domain>> domains_;
  nlohmann::json source_;
};

// The settings a search may vary: the rows of dsgd/runtime/settings.h marked tunable, by path.
const std::vector<std::string>& trainer_fields();
// `base` with `values` applied (settings by path or a tunable one's last part, else operator
// config keys). ConfigError for a value of the wrong type for its field.
TrainerConfig apply_values(TrainerConfig base, const nlohmann::json& values);

struct TuneOptions {
  std::string dir;                   // required
  int num_trials = 8;                // samples; each crossed with every grid point
  std::string scheduler = "fifo";    // fifo | asha | pbt
  int cores = 0;                     // 0: this machine's
  std::string metric = "test_accuracy";
  std::string mode = "max";          // max | min
  int max_iterations = 4;            // per trial
  int64_t steps_per_iteration = 0;   // 0: an epoch
  int grace_period = 1;              // asha
  int reduction_factor = 4;          // asha (Ray's AsyncHyperBandScheduler default)
  int perturbation_interval = 2;     // pbt, in iterations
  double quantile = 0.25;            // pbt
  double resample_probability = 0.25;  // pbt
  uint64_t seed = 1;                 // of the samples, and of PBT's choices
  // After every report (from the thread running the trial; serialised).
  std::function<void(const nlohmann::json& trial)> on_report;
};

// A trial as tune.json holds it: {"id", "params", "state" (pending, running, stopped, done,
// error), "history": [{"iteration", "time_s", metrics...}], "last", "best", "checkpoint",
// "error", "exploited": [{"iteration", "from", "params"}]}.
struct TuneResult {
  nlohmann::json trials = nlohmann::json::array();
  int best = -1;                     // index into trials: the best last metric of a trial that reported
  int stopped_early = 0;             // asha's
  int64_t iterations = 0;            // run, over all trials (the search's compute, in iterations)
  double wall_s = 0;
  nlohmann::json to_json(const TuneOptions& o) const;  // best, trials, trials_stopped_early, ...
};

class Tuner {
 public:
  // ConfigError, before anything runs, for bad options (an unknown scheduler or mode, no dir,
  // more cores than this machine has, a trial that would need more cores than given), an empty
  // space, and for every trial's values that the TrainerConfig or the image classifier reject.
  Tuner(std::string op, TrainerConfig base, SearchSpace space, TuneOptions options);
  TuneResult run();

 private:
  std::string op_;
  TrainerConfig base_;
  SearchSpace space_;
  TuneOptions options_;
  std::vector<nlohmann::json> initial_;  // every trial's first values, drawn and checked
};

}  // namespace dsgd
