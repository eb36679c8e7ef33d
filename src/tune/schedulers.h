// The tuner's decisions, apart from running trials (torch-free, unit-tested on their own):
// ASHA's rungs and cut-offs, and PBT's choice of who exploits whom.
//
//   tune::Asha asha({.grace_period = 1, .reduction_factor = 3, .max_iterations = 9, .maximize = true});
//   if (!asha.report(trial, iteration, accuracy)) stop(trial);
//   for (auto [loser, winner] : tune::pbt_exploits(scores, true, 0.25, gen)) copy(winner, loser);
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace dsgd::tune {

// Asynchronous successive halving (Li et al., 2018; Ray Tune's AsyncHyperBandScheduler, one
// bracket): rungs at grace_period x reduction_factor^k iterations, below max_iterations. A trial
// that reaches a rung is compared with the metrics recorded there before it: it goes on if it is
// at least their (1 - 1/reduction_factor) quantile (linear interpolation), else it stops; either
// way its metric is recorded. The first trial at a rung always goes on.
class Asha {
 public:
  struct Options {
    int grace_period = 1;
    int reduction_factor = 4;
    int max_iterations = 9;
    bool maximize = true;
  };
  explicit Asha(Options o);
  const std::vector<int>& rungs() const { return rungs_; }
  // After `trial`'s iteration `iteration` (1-based): false = stop it.
  bool report(int trial, int iteration, double metric);
  // A report already decided (a resumed search's history): recorded, no decision.
  void record(int trial, int iteration, double metric);

 private:
  Options o_;
  std::vector<int> rungs_;
  std::map<int, std::vector<double>> recorded_;  // rung -> metrics, in arrival order
  std::set<std::pair<int, int>> seen_;           // (rung, trial)
};

// The (1 - 1/rf)-quantile cut-off ASHA uses, numpy's default interpolation; for minimising, the
// metrics are negated by the caller.
double quantile(std::vector<double> values, double q);

// PBT's exploit step over the latest metrics of a population (NaN: no metric yet, never chosen):
// the ceil(n x quantile) worst (at most n/2) each take a random one of the as many best. Returns
// (loser, winner) pairs, indices into `scores`.
std::vector<std::pair<size_t, size_t>> pbt_exploits(const std::vector<double>& scores, bool maximize, double quantile,
                                                    std::mt19937_64& gen);

}  // namespace dsgd::tune
