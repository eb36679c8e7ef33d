// How many lost workers a job survives (TrainerConfig::recovery.max_failures): every failure
// counted, named, and held against the budget.
//
//   FailureBudget budget(config.recovery);
//   if (!budget.admit("worker 2 lost: heartbeat timeout")) fail(budget.exhausted());
//
// Torch-free; the Trainer's recovery and start-up restarts both count here.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "dsgd/common/trainer_config.h"

namespace dsgd::runtime {

class FailureBudget {
 public:
  using Clock = std::chrono::steady_clock;

  FailureBudget() = default;
  explicit FailureBudget(const RecoveryConfig& recovery) : recovery_(recovery) {}

  // Counts `failure` (seen at `now`); false when it is one more than the budget allows, the job
  // then to fail with exhausted().
  bool admit(const std::string& failure, Clock::time_point now = Clock::now());
  // "giving up after N failures (max_failures M): 1. ... 2. ...": every failure of the job.
  std::string exhausted() const;
  // "failure 2 of at most 3": for the warning a recovery logs.
  std::string position() const;

  int total() const { return static_cast<int>(log_.size()); }  // every failure of the job

 private:
  int counted() const;  // the failures held against the budget now

  RecoveryConfig recovery_;
  std::vector<std::string> log_;
  std::vector<Clock::time_point> seen_;
};

}  // namespace dsgd::runtime
