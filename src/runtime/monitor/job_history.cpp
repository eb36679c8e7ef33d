#include "runtime/monitor/job_history.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsgd/runtime/dashboard.h"
#include "dsgd/common/error.h"

namespace dsgd::runtime {
namespace {

using nlohmann::json;

void thin(json& points) {
  if (points.size() <= JobHistory::kMaxPoints) return;
  json kept = json::array();
  for (size_t i = 0; i < points.size(); i += 2) kept.push_back(std::move(points[i]));
  kept.push_back(points.back());
  points = std::move(kept);
}

}  // namespace

JobHistory::JobHistory(json settings) : settings_(std::move(settings)) {}

void JobHistory::add_train(double t_s, int64_t step, double loss, double samples_per_s) {
  std::lock_guard<std::mutex> lock(m_);
  train_.push_back({t_s, step, loss, samples_per_s});
  thin(train_);
}

void JobHistory::add_validation(double t_s, int64_t step, double loss, double accuracy) {
  std::lock_guard<std::mutex> lock(m_);
  validation_.push_back({t_s, step, loss, accuracy});
  thin(validation_);
}

void JobHistory::add_event(double t_s, int64_t step, const std::string& kind, const std::string& text) {
  std::lock_guard<std::mutex> lock(m_);
  events_.push_back({{"t", t_s}, {"step", step}, {"kind", kind}, {"text", text}});
  thin(events_);
}

std::string JobHistory::to_json(const JobGauges& now, bool ended) const {
  json workers = json::array();
  for (const auto& w : now.workers) {
    workers.push_back({{"index", w.index}, {"host", w.host}, {"pid", w.pid}, {"role", w.role},
                       {"step_s", w.step_s}, {"straggler", w.straggler}});
  }
  std::lock_guard<std::mutex> lock(m_);
  const json out = {{"settings", settings_}, {"train", train_},         {"validation", validation_},
                    {"events", events_},     {"workers", workers},      {"uptime_s", now.uptime_s},
                    {"ended", ended}};
  return out.dump();
}

void JobHistory::write(const std::string& dir, const JobGauges& now, bool ended) const {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/history.json", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out || !(out << to_json(now, ended)) || !out.flush()) throw Error("monitor: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error("monitor: cannot rename " + tmp + " to " + path);
}

std::string chart_js() {
  for (const char* path :
       {"/usr/share/javascript/chart.js/chart.min.js", "/usr/share/javascript/chart.js/Chart.min.js"}) {
    std::ifstream in(path);
    if (!in) continue;
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  return "";
}

namespace {

// The page: Chart.js charts of history.json, fetched again every 2 s until the job has ended;
// what it drew goes into #chart-data as JSON too (for a test, or a script).
constexpr const char* kPage = R"html(<!doctype html>
<html><head><meta charset="utf-8"><title>dsgd job</title>
<script src="chart.js"></script>
<style>
body { font-family: sans-serif; margin: 16px; background: #f6f7f9; color: #222; }
h2 { margin: 0 0 4px 0; } .status { font-size: 14px; color: #555; margin-bottom: 12px; }
.grid { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 14px; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px; }
.card h3 { margin: 0 0 6px 0; font-size: 15px; } canvas { max-height: 250px; }
table { border-collapse: collapse; font-size: 12px; width: 100%; }
td, th { border-bottom: 1px solid #eee; padding: 2px 6px; text-align: left; vertical-align: top; }
td:last-child { overflow-wrap: anywhere; } th, td:first-child { white-space: nowrap; }
.recovery { color: #b00; } .straggler { color: #a60; }
</style></head>
<body>
<h2>dsgd job <span id="state"></span></h2>
<div class="status" id="status">loading...</div>
<div class="grid">
  <div class="card"><h3>Loss (training, validation) and recoveries, by step</h3><canvas id="loss"></canvas></div>
  <div class="card"><h3>Samples/s, by time (s)</h3><canvas id="speed"></canvas></div>
  <div class="card"><h3>Seconds per step, by worker (stragglers in red)</h3><canvas id="ranks"></canvas></div>
  <div class="card"><h3>Recoveries and stragglers</h3><table id="events"></table></div>
  <div class="card"><h3>Validation accuracy, by step</h3><canvas id="accuracy"></canvas></div>
  <div class="card"><h3>Settings</h3><table id="settings"></table></div>
</div>
<pre id="chart-data" style="display: none"></pre>
<script>
const charts = {};
function draw(id, type, datasets, labels, xTitle) {
  if (!charts[id]) {
    const scales = type === 'bar' ? {} : {x: {type: 'linear', title: {display: true, text: xTitle}}};
    charts[id] = new Chart(document.getElementById(id), {type: type, data: {labels: labels, datasets: datasets},
      options: {animation: false, responsive: true, scales: scales,
                plugins: {legend: {display: datasets.length > 1}}}});
    return;
  }
  charts[id].data.labels = labels;
  datasets.forEach((d, i) => { Object.assign(charts[id].data.datasets[i], d); });
  charts[id].update();
}
function cell(row, text, cls) { const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; }
function lossAt(train, step) {
  let y = train.length ? train[0][2] : 0;
  for (const p of train) { if (p[1] <= step) y = p[2]; }
  return y;
}
async function refresh() {
  let h;
  try { h = await (await fetch('history.json', {cache: 'no-store'})).json(); }
  catch (e) { document.getElementById('status').textContent = 'no answer: ' + e; setTimeout(refresh, 2000); return; }
  const recoveries = h.events.filter(e => e.kind === 'recovery');
  const stragglers = h.events.filter(e => e.kind === 'straggler');
  draw('loss', 'line', [
    {label: 'training', data: h.train.map(p => ({x: p[1], y: p[2]})), borderColor: '#1f77b4', pointRadius: 0},
    {label: 'validation', data: h.validation.map(p => ({x: p[1], y: p[2]})), borderColor: '#2ca02c'},
    {label: 'recovery', type: 'scatter', data: recoveries.map(e => ({x: e.step, y: lossAt(h.train, e.step)})),
     backgroundColor: '#d62728', pointStyle: 'triangle', pointRadius: 8}], undefined, 'step');
  draw('speed', 'line', [{label: 'samples/s', data: h.train.map(p => ({x: p[0], y: p[3]})),
     borderColor: '#9467bd', pointRadius: 0}], undefined, 'seconds');
  const accuracy = h.validation.filter(p => p[3] >= 0);
  draw('accuracy', 'line', [{label: 'accuracy', data: accuracy.map(p => ({x: p[1], y: p[3]})),
     borderColor: '#2ca02c'}], undefined, 'step');
  const members = h.workers.filter(w => w.role === 'member');
  draw('ranks', 'bar', [{label: 's/step', data: members.map(w => w.step_s),
     backgroundColor: members.map(w => w.straggler ? '#d62728' : '#1f77b4')}],
     members.map(w => 'worker ' + w.index + ' (pid ' + w.pid + ')'));
  const ev = document.getElementById('events');
  ev.innerHTML = '<tr><th>time (s)</th><th>step</th><th>what</th></tr>';
  for (const e of h.events) {
    const row = ev.insertRow(); cell(row, e.t.toFixed(1)); cell(row, e.step); cell(row, e.text, e.kind);
  }
  const st = document.getElementById('settings');
  st.innerHTML = '';
  for (const [k, v] of Object.entries(h.settings)) {
    const row = st.insertRow(); cell(row, k); cell(row, typeof v === 'object' ? JSON.stringify(v) : v);
  }
  const last = h.train.length ? h.train[h.train.length - 1] : null;
  document.getElementById('state').textContent = h.ended ? '(ended)' : '(running)';
  document.getElementById('status').textContent = (last ? 'step ' + last[1] + ', loss ' + last[2].toFixed(4) +
      ', ' + last[3].toFixed(0) + ' samples/s; ' : '') + members.length + ' workers, ' + recoveries.length +
      ' recoveries, ' + stragglers.length + ' straggler events; up ' + h.uptime_s.toFixed(0) + ' s';
  document.getElementById('chart-data').textContent = JSON.stringify({
    train_points: charts.loss.data.datasets[0].data.length, validation_points: charts.loss.data.datasets[1].data.length,
    recovery_markers: charts.loss.data.datasets[2].data.length, speed_points: charts.speed.data.datasets[0].data.length,
    bars: charts.ranks.data.datasets[0].data.length,
    red_bars: charts.ranks.data.datasets[0].backgroundColor.filter(c => c === '#d62728').length,
    events: h.events.length, recoveries: recoveries.length, stragglers: stragglers.length, ended: h.ended});
  if (!h.ended) setTimeout(refresh, 2000);
}
refresh();
</script>
</body></html>
)html";

}  // namespace

const std::string& dashboard_page() {
  static const std::string page = kPage;
  return page;
}

}  // namespace dsgd::runtime

namespace dsgd {

struct DashboardServer::Impl {
  std::unique_ptr<runtime::MetricsServer> server;
};

DashboardServer::DashboardServer(const std::string& metrics_dir, const std::string& host, int port)
    : impl_(std::make_unique<Impl>()) {
  const std::string path = metrics_dir + "/history.json";
  if (!std::filesystem::exists(path)) {
    throw ConfigError("no " + path + ": the driver writes it when the job runs with --metrics-dir " + metrics_dir +
                      " (monitor.metrics_dir)");
  }
  impl_->server = runtime::MetricsServer::start(host, port, {}, [path] {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  });
}

DashboardServer::~DashboardServer() = default;

int DashboardServer::port() const { return impl_->server->port(); }

}  // namespace dsgd
