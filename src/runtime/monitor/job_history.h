// What the dashboard draws: a job's figures over time, kept by the driver as it trains and
// written to TrainerConfig::monitor.metrics_dir, so the page reads the same during the job and
// after it (`dsgd dashboard --metrics-dir DIR`).
//
//   JobHistory h(settings_json);
//   h.add_train(uptime_s, step, loss, samples_per_s);     // after each chunk of steps
//   h.add_validation(uptime_s, step, loss, accuracy);
//   h.add_event(uptime_s, step, "recovery", "worker 1 lost ...");
//   std::string page_data = h.to_json(gauges_now(), /*ended=*/false);
//
// Thread-safe: the training thread adds, the metrics server's thread reads. Training points past
// kMaxPoints are thinned (every other one dropped), so a week-long job's history stays small.
// Torch-free.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/monitor/metrics.h"

namespace dsgd::runtime {

class JobHistory {
 public:
  static constexpr size_t kMaxPoints = 4000;

  explicit JobHistory(nlohmann::json settings);
  void add_train(double t_s, int64_t step, double loss, double samples_per_s);
  void add_validation(double t_s, int64_t step, double loss, double accuracy);
  // kind: "recovery" or "straggler"; text: what happened, for a person.
  void add_event(double t_s, int64_t step, const std::string& kind, const std::string& text);

  // {"settings", "train": [[t, step, loss, samples/s]...], "validation": [[t, step, loss,
  // accuracy]...], "events": [{t, step, kind, text}...], "workers": [{index, host, pid, role,
  // step_s, straggler}...] (now's), "uptime_s", "ended"}.
  std::string to_json(const JobGauges& now, bool ended) const;
  // to_json written to <dir>/history.json (through a temporary file and a rename: a reader never
  // sees half of one). Throws dsgd::Error when it cannot be written.
  void write(const std::string& dir, const JobGauges& now, bool ended) const;

 private:
  mutable std::mutex m_;
  nlohmann::json settings_;
  nlohmann::json train_ = nlohmann::json::array();
  nlohmann::json validation_ = nlohmann::json::array();
  nlohmann::json events_ = nlohmann::json::array();
};

// The page (HTML and its script) that draws a history: it fetches history.json from where it
// was served every 2 s, and Chart.js from /chart.js.
const std::string& dashboard_page();
// Chart.js as Debian's libjs-chart.js installs it; "" when it is not there.
std::string chart_js();

}  // namespace dsgd::runtime
