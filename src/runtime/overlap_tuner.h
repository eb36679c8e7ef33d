// forward_overlap_buckets = -1 (auto): the driver chooses T, how many buckets travel after
// backward while the next forward goes on. The best T depends on how communication compares with
// compute (about half the buckets where the links are the limit, 0 where compute is), which only
// a run can tell. So train() runs its first steps in short trial chunks, kTrialSteps each, one per
// candidate (0, N/8, N/4, ... 3N/4 of the N buckets), the workers timing their steady steps, and
// keeps the fastest: the one below T = 0's time by more than kMargin, else 0. The driver decides
// and names T in every train command, so every worker uses the same T at every step, also across
// recoveries. Torch-free.
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
  static constexpr int64_t kTrialSteps = 6;  // per candidate; the first is not timed
  static constexpr double kMargin = 0.03;    // a T > 0 must beat T = 0 by this fraction

  bool tuning() const { return !decided_; }
  // T for the next train command: the candidate on trial, or the choice.
  size_t next() const { return decided_ ? chosen_ : candidates_.empty() ? 0 : candidates_[times_.size()]; }
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
    if (candidates_.empty()) {
      for (size_t k = 0; k <= 6; ++k) {
        const size_t t = std::min(buckets, (k * buckets + 4) / 8);
        if (candidates_.empty() || t != candidates_.back()) candidates_.push_back(t);
      }
    }
    if (batches < 3 || steady_step_s <= 0) return;
    times_.push_back(steady_step_s);
    if (times_.size() < candidates_.size()) return;
    size_t best = 0;
    for (size_t i = 1; i < times_.size(); ++i) {
      if (times_[i] < times_[best]) best = i;
    }
    chosen_ = times_[best] < (1 - kMargin) * times_[0] ? candidates_[best] : 0;
    decided_ = true;
  }
  // The same from the workers' answers to the train command: each names its replicas' slowest
  // steady_step_s and its buckets (worker.cpp); every step waits for the slowest worker.
  void record(int64_t batches, const std::vector<std::string>& worker_answers) {
    double steady = 0;
    size_t buckets = 0;
    for (const auto& a : worker_answers) {
      const auto j = nlohmann::json::parse(a);
      steady = std::max(steady, j.value("steady_step_s", 0.0));
      buckets = std::max(buckets, j.value("buckets", size_t{0}));
    }
    record(batches, steady, buckets);
  }
  // "forward_overlap_buckets auto: T=0: 61.2 ms, T=2: 60.1 ms, ...; chose 0", for the log.
  std::string summary() const {
    std::string s = "forward_overlap_buckets auto: ";
    char buf[64];
    for (size_t i = 0; i < times_.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%sT=%zu: %.1f ms", i ? ", " : "", candidates_[i], 1000 * times_[i]);
      s += buf;
    }
    if (decided_) s += "; chose " + std::to_string(chosen_);
    return s;
  }

 private:
  std::vector<size_t> candidates_;  // known after the first chunk (which tries T = 0)
  std::vector<double> times_;       // per candidate tried
  bool decided_ = false;
  size_t chosen_ = 0;
};

}  // namespace dsgd::runtime
