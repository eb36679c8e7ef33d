#include "runtime/driver/failure_budget.h"

#include <algorithm>
#include <utility>

namespace dsgd::runtime {
namespace {

// " within 1h" (recovery.failure_window: 30s, 10m, 250ms), or "" where failures count over the
// whole job.
std::string within(const RecoveryConfig& r) {
  const int64_t ms = r.failure_window.count();
  if (ms == 0) return "";
  for (const auto& [unit, size] : {std::pair{"h", 3600000}, {"m", 60000}, {"s", 1000}}) {
    if (ms % size == 0) return " within " + std::to_string(ms / size) + unit;
  }
  return " within " + std::to_string(ms) + "ms";
}

}  // namespace

bool FailureBudget::admit(const std::string& failure, Clock::time_point now) {
  log_.push_back(failure);
  seen_.push_back(now);
  return counted() <= recovery_.max_failures;
}

// Those within recovery.failure_window of the latest: checked at each failure, so no window of
// that length ever holds more than max_failures of them.
int FailureBudget::counted() const {
  if (recovery_.failure_window.count() == 0 || seen_.empty()) return total();
  const Clock::time_point since = seen_.back() - recovery_.failure_window;
  return static_cast<int>(std::count_if(seen_.begin(), seen_.end(), [&](Clock::time_point t) { return t > since; }));
}

std::string FailureBudget::exhausted() const {
  std::string all;
  for (size_t i = 0; i < log_.size(); ++i) all += "\n  " + std::to_string(i + 1) + ". " + log_[i];
  return "giving up after " + std::to_string(counted()) + " failures (max_failures " +
         std::to_string(recovery_.max_failures) + within(recovery_) + "):" + all;
}

std::string FailureBudget::position() const {
  return "failure " + std::to_string(counted()) + " of at most " + std::to_string(recovery_.max_failures) +
         within(recovery_);
}

}  // namespace dsgd::runtime
