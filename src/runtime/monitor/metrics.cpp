#include "runtime/monitor/metrics.h"

#include <httplib.h>

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include "dsgd/common/error.h"
#include "runtime/monitor/job_history.h"

namespace dsgd::runtime {
namespace {

// A label value with \, " and newlines escaped as the format wants.
std::string escaped(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A sample's value: finite numbers as they are, the rest as the format spells them.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

void family(std::ostringstream& out, const std::string& name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

void job_sample(std::ostringstream& out, const std::string& name, const char* type, const char* help, double v) {
  family(out, name, type, help);
  out << name << ' ' << number(v) << '\n';
}

template <typename F>
void worker_family(std::ostringstream& out, const JobGauges& g, const std::string& name, const char* type,
                   const char* help, F value) {
  family(out, name, type, help);
  for (const auto& w : g.workers) {
    out << name << "{worker=\"" << w.index << "\",host=\"" << escaped(w.host) << "\",pid=\"" << w.pid
        << "\",role=\"" << escaped(w.role) << "\"} " << number(value(w)) << '\n';
  }
}

class HttpMetricsServer final : public MetricsServer {
 public:
  HttpMetricsServer(const std::string& host, int port, std::function<JobGauges()> read,
                    std::function<std::string()> history)
      : read_(std::move(read)), history_(std::move(history)) {
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      ++scrapes_;
      if (!read_) {
        res.status = 404;
        res.set_content("no live job here: the dashboard of a finished one is at /\n", "text/plain");
        return;
      }
      res.set_content(prometheus_text(read_()), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/", [this](const httplib::Request&, httplib::Response& res) {
      if (history_) {
        res.set_content(dashboard_page(), "text/html; charset=utf-8");
      } else {
        res.set_content("dsgd driver: metrics at /metrics (Prometheus text format)\n", "text/plain");
      }
    });
    server_.Get("/history.json", [this](const httplib::Request&, httplib::Response& res) {
      ++scrapes_;
      if (!history_) {
        res.status = 404;
        return;
      }
      res.set_header("Cache-Control", "no-store");
      res.set_content(history_(), "application/json");
    });
    server_.Get("/chart.js", [](const httplib::Request&, httplib::Response& res) {
      static const std::string js = chart_js();
      if (js.empty()) {
        res.status = 404;
        res.set_content("// Chart.js is missing: apt install libjs-chart.js\n", "text/javascript");
        return;
      }
      res.set_header("Cache-Control", "max-age=3600");
      res.set_content(js, "text/javascript");
    });
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second job on the
    // same port would share it silently instead of being told.
    server_.set_socket_options([](auto sock) {
      const int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    port_ = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ < 0) {
      throw ConfigError("monitor: cannot listen on " + host + ":" + std::to_string(port) +
                        " for the metrics (in use, or not an address of this host); pick another "
                        "--metrics-port, or 0 for any free one");
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // Running before stop() can be called: a stop() before the loop starts would be missed, and
    // the loop would then wait in accept() for good.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!server_.is_running() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  ~HttpMetricsServer() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const override { return port_; }
  int64_t scrapes() const override { return scrapes_.load(); }

 private:
  std::function<JobGauges()> read_;
  std::function<std::string()> history_;
  httplib::Server server_;
  int port_ = -1;
  std::atomic<int64_t> scrapes_{0};
  std::thread thread_;
};

}  // namespace

std::string prometheus_text(const JobGauges& g) {
  std::ostringstream out;
  job_sample(out, "dsgd_steps_total", "counter",
             "Training steps completed over the job, counted as each chunk of steps ends (a snapshot point).",
             static_cast<double>(g.steps));
  job_sample(out, "dsgd_step", "gauge",
             "The step the slowest worker is at, as its last heartbeat said (at most a second old).",
             static_cast<double>(g.step));
  job_sample(out, "dsgd_samples_total", "counter", "Training samples processed (steps x global batch).",
             static_cast<double>(g.samples));
  job_sample(out, "dsgd_samples_per_second", "gauge", "Training throughput over the last chunk of steps.",
             g.samples_per_s);
  job_sample(out, "dsgd_loss", "gauge", "The training loss of worker 0's last batch.", g.loss);
  job_sample(out, "dsgd_recoveries_total", "counter", "Worker failures the job survived.",
             static_cast<double>(g.recoveries));
  job_sample(out, "dsgd_checkpoint_failures_total", "counter",
             "Periodic checkpoints that could not be written (training went on).",
             static_cast<double>(g.checkpoint_failures));
  job_sample(out, "dsgd_workers", "gauge", "Worker processes in the training group.",
             static_cast<double>(g.members));
  job_sample(out, "dsgd_standbys", "gauge", "Standby workers ready to take a lost worker's place.",
             static_cast<double>(g.standbys));
  job_sample(out, "dsgd_stragglers", "gauge",
             "Workers computing a step >= 10% longer than the others' median, over a window of >= 20 steps and 10 s.",
             static_cast<double>(g.stragglers));
  job_sample(out, "dsgd_uptime_seconds", "gauge", "Seconds since the driver started.", g.uptime_s);
  job_sample(out, "dsgd_control_calls_total", "counter",
             "Calls the driver's control plane received (registrations, commands, heartbeats, rendezvous).",
             static_cast<double>(g.control_calls));
  worker_family(out, g, "dsgd_worker_step", "gauge", "The step the worker is at (its place in the epochs).",
                [](const WorkerGauge& w) { return static_cast<double>(w.step); });
  worker_family(out, g, "dsgd_worker_loss", "gauge", "The loss of the worker's last batch.",
                [](const WorkerGauge& w) { return w.loss; });
  worker_family(out, g, "dsgd_worker_step_seconds", "gauge", "The worker's recent seconds per step.",
                [](const WorkerGauge& w) { return w.step_s; });
  worker_family(out, g, "dsgd_worker_heartbeat_age_seconds", "gauge", "Seconds since the worker's last heartbeat.",
                [](const WorkerGauge& w) { return w.heartbeat_age_s; });
  worker_family(out, g, "dsgd_worker_compute_seconds_total", "counter",
                "Seconds of the worker's steps spent computing (all but the waits for communication).",
                [](const WorkerGauge& w) { return w.compute_s; });
  worker_family(out, g, "dsgd_worker_comm_wait_seconds_total", "counter",
                "Seconds of the worker's steps spent waiting for communication (for the other workers).",
                [](const WorkerGauge& w) { return w.wait_s; });
  worker_family(out, g, "dsgd_worker_straggler", "gauge", "1 while the worker is named a straggler, else 0.",
                [](const WorkerGauge& w) { return w.straggler ? 1.0 : 0.0; });
  return out.str();
}

std::unique_ptr<MetricsServer> MetricsServer::start(const std::string& host, int port,
                                                    std::function<JobGauges()> read,
                                                    std::function<std::string()> history) {
  return std::make_unique<HttpMetricsServer>(host, port, std::move(read), std::move(history));
}

}  // namespace dsgd::runtime
