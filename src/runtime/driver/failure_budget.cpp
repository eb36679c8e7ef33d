#include "runtime/driver/failure_budget.h"

namespace dsgd::runtime {

bool FailureBudget::admit(const std::string& failure, Clock::time_point now) {
  log_.push_back(failure);
  seen_.push_back(now);
  return counted() <= recovery_.max_failures;
}

int FailureBudget::counted() const { return total(); }

std::string FailureBudget::exhausted() const {
  std::string all;
  for (size_t i = 0; i < log_.size(); ++i) all += "\n  " + std::to_string(i + 1) + ". " + log_[i];
  return "giving up after " + std::to_string(counted()) + " failures (max_failures " +
         std::to_string(recovery_.max_failures) + "):" + all;
}

std::string FailureBudget::position() const {
  return "failure " + std::to_string(counted()) + " of at most " + std::to_string(recovery_.max_failures);
}

}  // namespace dsgd::runtime
