// The job's live figures for a monitoring system (TrainerConfig::monitor): what the training
// thread publishes after set-up, each chunk and each recovery, what a scrape of
// runtime/monitor/metrics.h's server reads (those figures and every worker's last heartbeat), and
// the dashboard's history (validation results, recoveries, stragglers) saved to metrics_dir. A
// part of the driver's Job (runtime/driver/job.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "runtime/monitor/job_history.h"
#include "runtime/monitor/metrics.h"

namespace dsgd::runtime {

class Job;

class JobMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  explicit JobMonitor(Job& job) : job_(job) {}

  // monitor.metrics_port: starts the server; with it or metrics_dir, the history (else nothing).
  void start();
  // Stops the server: before the control plane's, whose workers its scrapes read.
  void stop() { metrics_.reset(); }
  // The training thread's figures for the next scrape (samples_per_s < 0: unchanged).
  void publish(double samples_per_s = -1);
  void record_validation(const Results& r);
  void record_event(const std::string& kind, const std::string& text);
  // The history to metrics_dir (after each chunk; `ended` at shutdown).
  void save_history(bool ended);
  // The members a scrape marks as stragglers, by pid.
  void set_stragglers(std::vector<int64_t> pids);
  // Seconds since the job's start.
  double uptime_s() const { return std::chrono::duration<double>(Clock::now() - started_at_).count(); }

 private:
  JobGauges gauges_now() const;  // what a scrape shows

  Job& job_;
  const Clock::time_point started_at_ = Clock::now();
  std::unique_ptr<JobHistory> history_;
  std::unique_ptr<MetricsServer> metrics_;
  mutable std::mutex m_;  // guards the three below: a scrape reads them on the server's thread
  JobGauges published_;
  std::vector<int> members_;
  std::vector<int64_t> stragglers_;
};

}  // namespace dsgd::runtime
