// forward_overlap_buckets = -1 (auto): the driver chooses T, how many buckets travel after
// backward while the next forward goes on. The best T depends on how communication compares with
// compute (about a third of the buckets where the links are the limit, 0 where compute is), which
// only a run can tell. So train() runs its first steps in short trial chunks, kTrialSteps each,
// the workers timing their steady steps. A first round tries every candidate: 0, 3N/16, N/4,
// 5N/16, 3N/8 and N/2 of the N buckets (where the links are the limit the best is near N/4 to
// N/3 in bench/overlap_model.py, and up to N/2 costs little where compute is). A second round
// tries T = 0 and the first round's kFinalists fastest again, and the finalist with the lowest
// mean of its two trials stays if it beats T = 0's mean by more than kMargin, else 0. One
// six-step trial is a noisy reading on a shared machine (trials of close candidates spread by
// several percent with no trend); the second round gives the candidates that matter two readings
// each, taken close in time. The driver decides and names T in every train command, so every
// worker uses the same T at every step, also across recoveries. Torch-free.
//
//   OverlapTuner tuner;
//   int64_t chunk = tuner.trial_chunk(planned);        // shorter while trying
//   ... train `chunk` steps with T = tuner.next() ...
//   tuner.record(batches, workers_steady_step_s, buckets);
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsgd::runtime {

class OverlapTuner {
 public:
  static constexpr int64_t kTrialSteps = 6;  // per trial; the first step is not timed
  static constexpr double kMargin = 0.03;    // a T > 0 must beat T = 0 by this fraction
  static constexpr size_t kFinalists = 2;    // T > 0 tried again in the second round
  static constexpr size_t kSixteenths[] = {0, 3, 4, 5, 6, 8};  // the first round's T, in N/16

  bool tuning() const { return !decided_; }
  // T for the next train command: the candidate on trial, or the choice.
  size_t next() const { return decided_ ? chosen_ : plan_.empty() ? 0 : plan_[times_.size()]; }
  // The steps of the next chunk, given the planned ones (0: to the epoch's end): at most a trial's.
  int64_t trial_chunk(int64_t planned) const {
    if (decided_) return planned;
    return planned > 0 ? std::min(planned, kTrialSteps) : kTrialSteps;
  }
  // After a chunk trained with T = next(): its batches, the slowest worker's steady seconds per
  // step (ReplicaRuntime::steady_step_seconds) and the number of buckets. A chunk of fewer than
  // 3 batches (an epoch's end) is tried again.
  void record(int64_t batches, double steady_step_s, size_t buckets) {
    if (decided_) return;
    if (plan_.empty()) {
      for (size_t k : kSixteenths) {
        const size_t t = std::min(buckets, (k * buckets + 8) / 16);
        if (plan_.empty() || t != plan_.back()) plan_.push_back(t);
      }
      first_round_ = plan_.size();
    }
    if (batches < 3 || steady_step_s <= 0) return;
    times_.push_back(steady_step_s);
    if (times_.size() < plan_.size()) return;
    if (plan_.size() == first_round_ && first_round_ > 1) {  // the second round: 0 and the finalists
      std::vector<size_t> order(first_round_ - 1);
      for (size_t i = 0; i < order.size(); ++i) order[i] = i + 1;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times_[a] < times_[b]; });
      order.resize(std::min(order.size(), kFinalists));
      std::sort(order.begin(), order.end());
      plan_.push_back(0);
      for (size_t i : order) plan_.push_back(plan_[i]);
      return;
    }
    size_t best = 0;
    for (size_t i = first_round_ + 1; i < plan_.size(); ++i) {
      if (mean_of(plan_[i]) < mean_of(plan_[best])) best = i;
    }
    chosen_ = mean_of(plan_[best]) < (1 - kMargin) * mean_of(0) ? plan_[best] : 0;
    decided_ = true;
  }
  // "forward_overlap_buckets auto: T=0: 61.2 ms, T=2: 60.1 ms, ...; again: T=0: 60.8 ms, ...;
  // chose 0", for the log.
  std::string summary() const {
    std::string s = "forward_overlap_buckets auto: ";
    char buf[64];
    for (size_t i = 0; i < times_.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%sT=%zu: %.1f ms", i == 0 ? "" : i == first_round_ ? "; again: " : ", ",
                    plan_[i], 1000 * times_[i]);
      s += buf;
    }
    if (decided_) s += "; chose " + std::to_string(chosen_);
    return s;
  }

 private:
  // The mean of T's trials.
  double mean_of(size_t t) const {
    double sum = 0;
    int n = 0;
    for (size_t i = 0; i < times_.size(); ++i) {
      if (plan_[i] == t) sum += times_[i], ++n;
    }
    return sum / n;
  }

  std::vector<size_t> plan_;    // T per trial: known after the first chunk (which tries T = 0)
  size_t first_round_ = 0;      // trials in the first round
  std::vector<double> times_;   // per trial done
  bool decided_ = false;
  size_t chosen_ = 0;
};

}  // namespace dsgd::runtime
