// dsgd/runtime/dashboard.h — a job's dashboard from its files: the page a driver serves at / with
// TrainerConfig::monitor.metrics_port (loss and validation curves, samples/s, each worker's step
// time, recoveries, stragglers, the settings), drawn from <metrics_dir>/history.json, which the
// driver writes as the job goes (monitor.metrics_dir). So a finished job stays readable, and a
// running one can be watched from a machine that sees its files only.
//
//   dsgd::DashboardServer d("runs/job1", "127.0.0.1", 8080);   // http://127.0.0.1:8080/
//   ... serves until destroyed (`dsgd dashboard --metrics-dir runs/job1`)
#pragma once

#include <memory>
#include <string>

namespace dsgd {

class DashboardServer {
 public:
  // ConfigError when `metrics_dir` holds no history.json (naming the flag that writes one), or
  // host:port cannot be listened on; port 0 picks a free one.
  DashboardServer(const std::string& metrics_dir, const std::string& host, int port);
  ~DashboardServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsgd
