// The driver's live figures for a monitoring system: Prometheus' text exposition format, served
// over HTTP while the job runs (TrainerConfig::monitor.metrics_port).
//
//   auto server = MetricsServer::start("127.0.0.1", 0, [&] { return gauges_now(); });
//   // curl http://127.0.0.1:<server->port()>/metrics
//
// `read` runs on the server's thread for each scrape: it must be thread-safe and quick. What it
// returns is rendered by prometheus_text (pure: tested on its own). Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dsgd::runtime {

// One worker process as the driver last heard of it (its heartbeat).
struct WorkerGauge {
  int64_t index = 0;   // the driver's id for it
  std::string host;
  int64_t pid = 0;
  std::string role;    // "member" (trains) or "standby" (the lost are not listed)
  int64_t step = 0;              // the step its replicas are at (epoch x steps per epoch + batch)
  double loss = 0;               // its last batch's loss
  double step_s = 0;             // its recent seconds per step (0: not yet known)
  double heartbeat_age_s = 0;    // since its last heartbeat
  double compute_s = 0;          // its steps' seconds computing, over its life (heartbeat)
  double wait_s = 0;             //   and waiting for communication
  bool straggler = false;        // named a straggler now (dsgd::Straggler)
};

struct JobGauges {
  int64_t steps = 0;                // completed over the job (every train() call), as of the last chunk
  int64_t step = 0;                 // the step the slowest member is at now (from heartbeats)
  int64_t samples = 0;              // steps x the global batch
  double samples_per_s = 0;         // over the last chunk of steps
  double loss = 0;                  // worker 0's last batch
  int64_t recoveries = 0;           // failures survived (every kind but scale-ups)
  int64_t checkpoint_failures = 0;  // checkpoints.dir writes that failed
  int64_t members = 0;              // workers in the group
  int64_t standbys = 0;             // workers waiting to take a lost one's place
  int64_t stragglers = 0;           // members named stragglers now
  double uptime_s = 0;              // since the driver started
  int64_t control_calls = 0;        // calls the driver's control-plane servers received
  std::vector<WorkerGauge> workers;
};

// Every gauge and counter in Prometheus' text format (version 0.0.4), each family with HELP and
// TYPE: job-wide dsgd_* and per-worker dsgd_worker_*{worker, host, pid, role}.
std::string prometheus_text(const JobGauges& gauges);

class MetricsServer {
 public:
  // Listens on host:port (0: a free port) and serves GET /metrics from `read` (none: 404, a
  // finished job's), and the dashboard: / (job_history.h's page), /chart.js and /history.json
  // from `history` (none: 404). Throws dsgd::ConfigError naming the address when it cannot
  // listen there.
  static std::unique_ptr<MetricsServer> start(const std::string& host, int port, std::function<JobGauges()> read,
                                              std::function<std::string()> history = {});
  virtual ~MetricsServer() = default;  // stops serving
  virtual int port() const = 0;
  virtual int64_t scrapes() const = 0;  // requests served
};

}  // namespace dsgd::runtime
