// The Trainer's live figures for a monitoring system (TrainerConfig::monitor): what the training
// thread publishes, and what a scrape of runtime/monitor/metrics.h's server reads.
#include <algorithm>

#include "runtime/control/log.h"
#include "runtime/driver/trainer_impl.h"

namespace dsgd {

void Trainer::Impl::start_metrics() {
  const auto& m = config.monitor;
  if (m.metrics_port < 0) return;
  metrics = runtime::MetricsServer::start(m.metrics_host, m.metrics_port, [this] { return gauges_now(); });
  control::log().info("driver: metrics at http://{}:{}/metrics", m.metrics_host, metrics->port());
}

void Trainer::Impl::publish_gauges(double samples_per_s) {
  if (!metrics) return;
  std::lock_guard<std::mutex> lock(published_m);
  auto& g = published;
  g.steps = steps_done;
  g.samples = steps_done * config.batch_size;
  if (samples_per_s >= 0) g.samples_per_s = samples_per_s;
  g.recoveries = failures;
  g.checkpoint_failures = checkpoint_failures_total;
  published_members = pool ? pool->members() : std::vector<int>{};
}

runtime::JobGauges Trainer::Impl::gauges_now() const {
  runtime::JobGauges g;
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(published_m);
    g = published;
    members = published_members;
  }
  g.uptime_s = std::chrono::duration<double>(Clock::now() - started_at).count();
  if (!server) return g;
  const auto workers = server->workers();  // thread-safe: every worker that registered
  for (const auto& w : workers) {
    runtime::WorkerGauge out;
    out.index = w.index;
    out.host = w.host;
    out.pid = w.pid;
    const bool member = std::find(members.begin(), members.end(), static_cast<int>(w.index)) != members.end();
    out.role = !w.alive ? "lost" : member ? "member" : "standby";
    out.heartbeat_age_s = w.since_heartbeat_s;
    const json p = json::parse(w.progress.empty() ? "null" : w.progress, nullptr, false);
    if (p.is_object()) {
      out.step = p.value("step", int64_t{0});
      out.loss = p.value("loss", 0.0);
      out.step_s = p.value("step_s", 0.0);
    }
    if (!w.alive) continue;  // the lost are counted in dsgd_recoveries_total
    if (member) g.step = g.members == 0 ? out.step : std::min(g.step, out.step);
    if (member) ++g.members;
    if (!member) ++g.standbys;
    if (!members.empty() && w.index == members.front()) g.loss = out.loss;
    g.workers.push_back(std::move(out));
  }
  return g;
}

}  // namespace dsgd
