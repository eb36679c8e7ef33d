// The job's live figures and the dashboard's history (runtime/driver/job_monitor.h).
#include "runtime/driver/job_monitor.h"

#include <algorithm>
#include <utility>

#include "dsgd/runtime/settings.h"
#include "control/log.h"
#include "runtime/driver/job.h"

namespace dsgd::runtime {

using json = nlohmann::json;

void JobMonitor::start() {
  const auto& config = job_.config;
  const auto& m = config.monitor;
  if (m.metrics_port < 0 && m.metrics_dir.empty()) return;
  // The settings table: every top-level setting, and each group's that differ from the default.
  json settings = changed_settings(config);
  const json all = settings_of(config);
  for (const auto& [path, value] : all.items()) {
    if (path.find('.') == std::string::npos) settings[path] = value;
  }
  settings.update(
      {{"operator", job_.op_name}, {"control_plane", job_.tls() ? "tls" : "plaintext"}, {"config", config.config}});
  history_ = std::make_unique<JobHistory>(std::move(settings));
  if (m.metrics_port < 0) return;
  metrics_ = MetricsServer::start(
      m.metrics_host, m.metrics_port, [this] { return gauges_now(); },
      [this] { return history_->to_json(gauges_now(), false); });
  control::log().info("driver: metrics at http://{}:{}/metrics, dashboard at http://{}:{}/", m.metrics_host,
                      metrics_->port(), m.metrics_host, metrics_->port());
}

void JobMonitor::publish(double samples_per_s) {
  if (!metrics_ && !history_) return;
  const int64_t steps = job_.steps_done;
  {
    std::lock_guard<std::mutex> lock(m_);
    auto& g = published_;
    g.steps = steps;
    g.samples = steps * job_.config.batch_size;
    if (samples_per_s >= 0) g.samples_per_s = samples_per_s;
    g.recoveries = job_.recovery.failures().total();
    g.checkpoint_failures = job_.checkpoints.total_failures();
    members_ = job_.pool ? job_.pool->members() : std::vector<int>{};
  }
  if (history_ && samples_per_s > 0) {
    const auto now = gauges_now();
    history_->add_train(now.uptime_s, steps, now.loss, samples_per_s);
    save_history(false);
  }
}

void JobMonitor::record_validation(const Results& r) {
  if (!history_) return;
  const auto value = [&](const char* key) { return r.metrics.count(key) ? r.metrics.at(key) : -1.0; };
  history_->add_validation(uptime_s(), job_.steps_done, value("loss"), value("accuracy"));
  save_history(false);
}

void JobMonitor::record_event(const std::string& kind, const std::string& text) {
  if (!history_) return;
  history_->add_event(uptime_s(), job_.steps_done, kind, text);
}

void JobMonitor::save_history(bool ended) {
  const std::string& dir = job_.config.monitor.metrics_dir;
  if (!history_ || dir.empty()) return;
  try {
    history_->write(dir, gauges_now(), ended);
  } catch (const std::exception& e) {
    control::log().warn("driver: the dashboard's history was not saved: {}", e.what());
  }
}

void JobMonitor::set_stragglers(std::vector<int64_t> pids) {
  std::lock_guard<std::mutex> lock(m_);
  stragglers_ = std::move(pids);
}

JobGauges JobMonitor::gauges_now() const {
  JobGauges g;
  std::vector<int> members;
  std::vector<int64_t> slow;
  {
    std::lock_guard<std::mutex> lock(m_);
    g = published_;
    members = members_;
    slow = stragglers_;
  }
  g.uptime_s = uptime_s();
  const auto& server = job_.server;
  if (!server) return g;
  g.control_calls = server->calls();
  const auto workers = server->workers();  // thread-safe: every worker that registered
  for (const auto& w : workers) {
    WorkerGauge out;
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
      out.compute_s = p.value("compute_s", 0.0);
      out.wait_s = p.value("wait_s", 0.0);
    }
    out.straggler = member && std::find(slow.begin(), slow.end(), w.pid) != slow.end();
    if (out.straggler && w.alive) ++g.stragglers;
    if (!w.alive) continue;  // the lost are counted in dsgd_recoveries_total
    if (member) g.step = g.members == 0 ? out.step : std::min(g.step, out.step);
    if (member) ++g.members;
    if (!member) ++g.standbys;
    if (!members.empty() && w.index == members.front()) g.loss = out.loss;
    g.workers.push_back(std::move(out));
  }
  return g;
}

}  // namespace dsgd::runtime
