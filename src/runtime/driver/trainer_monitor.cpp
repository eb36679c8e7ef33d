// The Trainer's live figures for a monitoring system (TrainerConfig::monitor): what the training
// thread publishes, and what a scrape of runtime/monitor/metrics.h's server reads.
#include <algorithm>
#include <utility>

#include "dsgd/runtime/fit.h"
#include "dsgd/runtime/settings.h"
#include "control/log.h"
#include "runtime/driver/trainer_impl.h"
#include "runtime/worker/trace_file.h"

namespace dsgd {

void Trainer::Impl::start_metrics() {
  const auto& m = config.monitor;
  if (m.metrics_port < 0 && m.metrics_dir.empty()) return;
  // The settings table: every top-level setting, and each group's that differ from the default.
  json settings = changed_settings(config);
  const json all = settings_of(config);
  for (const auto& [path, value] : all.items()) {
    if (path.find('.') == std::string::npos) settings[path] = value;
  }
  settings.update({{"operator", op_name}, {"control_plane", tls ? "tls" : "plaintext"}, {"config", config.config}});
  history = std::make_unique<runtime::JobHistory>(std::move(settings));
  if (m.metrics_port < 0) return;
  metrics = runtime::MetricsServer::start(
      m.metrics_host, m.metrics_port, [this] { return gauges_now(); },
      [this] { return history->to_json(gauges_now(), false); });
  control::log().info("driver: metrics at http://{}:{}/metrics, dashboard at http://{}:{}/", m.metrics_host,
                      metrics->port(), m.metrics_host, metrics->port());
}

void Trainer::Impl::publish_gauges(double samples_per_s) {
  if (!metrics && !history) return;
  {
    std::lock_guard<std::mutex> lock(published_m);
    auto& g = published;
    g.steps = steps_done;
    g.samples = steps_done * config.batch_size;
    if (samples_per_s >= 0) g.samples_per_s = samples_per_s;
    g.recoveries = failures.total();
    g.checkpoint_failures = checkpoint_failures_total;
    published_members = pool ? pool->members() : std::vector<int>{};
  }
  if (history && samples_per_s > 0) {
    const auto now = gauges_now();
    history->add_train(now.uptime_s, steps_done, now.loss, samples_per_s);
    save_history(false);
  }
}

void Trainer::Impl::record_validation(const Results& r) {
  if (!history) return;
  const auto value = [&](const char* key) { return r.metrics.count(key) ? r.metrics.at(key) : -1.0; };
  history->add_validation(std::chrono::duration<double>(Clock::now() - started_at).count(), steps_done,
                          value("loss"), value("accuracy"));
  save_history(false);
}

void Trainer::Impl::record_event(const std::string& kind, const std::string& text) {
  if (!history) return;
  history->add_event(std::chrono::duration<double>(Clock::now() - started_at).count(), steps_done, kind, text);
}

void Trainer::Impl::save_history(bool ended) {
  if (!history || config.monitor.metrics_dir.empty()) return;
  try {
    history->write(config.monitor.metrics_dir, gauges_now(), ended);
  } catch (const std::exception& e) {
    control::log().warn("driver: the dashboard's history was not saved: {}", e.what());
  }
}

runtime::JobGauges Trainer::Impl::gauges_now() const {
  runtime::JobGauges g;
  std::vector<int> members;
  std::vector<int64_t> slow;
  {
    std::lock_guard<std::mutex> lock(published_m);
    g = published;
    members = published_members;
    slow = published_stragglers;
  }
  g.uptime_s = std::chrono::duration<double>(Clock::now() - started_at).count();
  if (!server) return g;
  g.control_calls = server->calls();
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

void Trainer::Impl::watch_stragglers() {
  const auto now = Clock::now();
  if (now - stragglers_checked < milliseconds(500)) return;
  stragglers_checked = now;
  const auto members = pool->members();
  const auto workers = server->workers();
  if (generation != stragglers_generation) {  // a recovery: other members, other windows
    stragglers.reset(steps_done);
    stragglers_generation = generation;
    std::lock_guard<std::mutex> lock(published_m);
    published_stragglers.clear();
  }
  const double now_s = std::chrono::duration<double>(now - started_at).count();
  for (size_t rank = 0; rank < members.size(); ++rank) {
    const auto& w = workers.at(static_cast<size_t>(members[rank]));
    const json p = json::parse(w.progress.empty() ? "null" : w.progress, nullptr, false);
    if (!p.is_object() || !p.contains("timed_steps")) continue;
    stragglers.observe(members[rank], static_cast<int>(rank), w.host, w.pid, p.value("step", int64_t{0}),
                       p.value("timed_steps", int64_t{0}), p.value("compute_s", 0.0), now_s);
  }
  const auto changed = stragglers.update();
  if (!changed.empty()) {
    std::lock_guard<std::mutex> lock(published_m);
    published_stragglers.clear();
    for (const Straggler& s : stragglers.current()) published_stragglers.push_back(s.pid);
  }
  for (const Straggler& s : changed) {
    straggler_changes.emplace_back(now, s);
    if (s.to_step < 0) {
      control::log().warn("trainer: rank {} (host {}, pid {}) is a straggler: it computes {:.2f}x as long a step as "
                          "the others (since step {})", s.rank, s.host, s.pid, s.slowdown, s.from_step);
      record_event("straggler", fmt::format("rank {} (pid {}) a straggler: {:.2f}x the others' compute per step",
                                            s.rank, s.pid, s.slowdown));
    } else {
      control::log().info("trainer: rank {} (host {}, pid {}) keeps pace again (slow from step {} to {}, at worst "
                          "{:.2f}x)", s.rank, s.host, s.pid, s.from_step, s.to_step, s.slowdown);
      record_event("straggler", fmt::format("rank {} (pid {}) keeps pace again (at worst {:.2f}x)", s.rank, s.pid,
                                            s.slowdown));
    }
  }
  // Each watch, not only when named: a standby set up later still takes a straggler's place.
  if (config.recovery.on_straggler == StragglerAction::kEvict) {
    for (const Straggler& s : stragglers.current()) evict_straggler(members.at(static_cast<size_t>(s.rank)), s);
  }
}

void Trainer::Impl::evict_straggler(int id, const Straggler& s) {
  if (pool->ready().empty()) {
    if (std::find(kept_stragglers.begin(), kept_stragglers.end(), s.pid) == kept_stragglers.end()) {
      kept_stragglers.push_back(s.pid);
      control::log().warn("trainer: rank {} (pid {}) is not evicted: no standby is ready to take its place "
                          "(--standby N); a lost worker would cost more than a slow one", s.rank, s.pid);
    }
    return;
  }
  stragglers.evicted(s.pid);
  evicting.push_back(id);
  throw CommError(fmt::format("rank {} (host {}, pid {}) evicted as a straggler: it computed {:.2f}x as long a step "
                              "as the others since step {}", s.rank, s.host, s.pid, s.slowdown, s.from_step),
                  "straggler", s.rank, s.host);
}

void Trainer::Impl::add_straggler_notes(runtime::TraceFile* trace, Clock::time_point t0) {
  for (const auto& [at, s] : std::exchange(straggler_changes, {})) {
    const std::string what = s.to_step < 0 ? "straggler: rank " : "keeps pace again: rank ";
    trace->add_note(std::chrono::duration<double, std::micro>(at - t0).count(), what + std::to_string(s.rank),
                    to_json(s));
  }
}

}  // namespace dsgd
