// A replica's step times (torch/replica/step_times.h).
#include "torch/replica/step_times.h"

#include <algorithm>

namespace dsgd::torch_glue {

void StepTimes::begin_call(bool profile, int64_t batches_per_epoch) {
  profiling_ = profile;
  phase_s_.clear();
  step_values_.clear();
  gate_s_ = 0;
  step_ends_.clear();
  progress_.batches_per_epoch = batches_per_epoch;
}

void StepTimes::add_value(const std::string& name, double value) {
  auto& [sum, count] = step_values_[name];
  sum += value;
  ++count;
}

void StepTimes::step_ended(double waited_s, int64_t step) {
  step_ends_.push_back(Clock::now());
  if (step_ends_.size() >= 2) {  // the step's time, averaged over the last ~5 steps
    const double s = std::chrono::duration<double>(step_ends_.back() - step_ends_[step_ends_.size() - 2]).count();
    const double old = progress_.step_s.load();
    progress_.step_s = old > 0 ? 0.8 * old + 0.2 * s : s;
    const double wait = std::clamp(waited_s - waited_at_last_step_, 0.0, s);
    progress_.wait_s = progress_.wait_s.load() + wait;
    progress_.compute_s = progress_.compute_s.load() + (s - wait);
    ++progress_.timed_steps;
  }
  waited_at_last_step_ = waited_s;
  ++progress_.batches;
  progress_.step = step;
}

double StepTimes::steady_step_seconds() const {
  std::vector<double> gaps;
  for (size_t i = 1; i < step_ends_.size(); ++i) {
    gaps.push_back(std::chrono::duration<double>(step_ends_[i] - step_ends_[i - 1]).count());
  }
  if (gaps.empty()) return 0;
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  return gaps[gaps.size() / 2];
}

void StepTimes::add_phase_means(Metrics* m, double batches) const {
  for (const auto& [k, v] : phase_s_) (*m)[k] = v / batches;
}

void StepTimes::add_value_means(Metrics* m) const {
  for (const auto& [name, v] : step_values_) (*m)[name] = v.first / static_cast<double>(v.second);
}

}  // namespace dsgd::torch_glue
