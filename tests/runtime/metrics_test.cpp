// The driver's metrics: the text exposition (every family typed and described, labels escaped)
// and the HTTP server that serves it; the dashboard's history, its page and its file.
#include "runtime/monitor/metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dsgd/runtime/dashboard.h"
#include "dsgd/common/error.h"
#include "runtime/monitor/job_history.h"

namespace dsgd::runtime {
namespace {

JobGauges two_workers() {
  JobGauges g;
  g.steps = 12;
  g.samples = 768;
  g.samples_per_s = 410.5;
  g.loss = 1.25;
  g.recoveries = 1;
  g.members = 1;
  g.standbys = 1;
  g.step = 112;
  g.stragglers = 1;
  g.workers.push_back({0, "node-a", 101, "member", 112, 1.25, 0.078, 0.1, 7.5, 0.25, true});
  g.workers.push_back({2, "node \"b\"\\x", 202, "standby", 0, 0, 0, 0.3});
  return g;
}

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, EveryFamilyIsTypedAndEveryWorkerLabelled) {
  const std::string t = prometheus_text(two_workers());
  EXPECT_TRUE(has_line(t, "# TYPE dsgd_steps_total counter")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_steps_total 12")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_samples_total 768")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_step 112")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_worker_step{worker=\"0\",host=\"node-a\",pid=\"101\",role=\"member\"} 112")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_samples_per_second 410.5")) << t;
  EXPECT_TRUE(has_line(t, "# TYPE dsgd_standbys gauge")) << t;
  EXPECT_TRUE(has_line(t, "# TYPE dsgd_control_calls_total counter")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_recoveries_total 1")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_worker_step_seconds{worker=\"0\",host=\"node-a\",pid=\"101\",role=\"member\"} 0.078"))
      << t;
  // A quote and a backslash in a label value are escaped.
  const std::string escaped = "host=\"node \\\"b\\\"\\\\x\"";  // host="node \"b\"\\x"
  EXPECT_TRUE(has_line(t, "dsgd_worker_step{worker=\"2\"," + escaped + ",pid=\"202\",role=\"standby\"} 0")) << t;
  // Each family once: a HELP and a TYPE line before its samples.
  size_t families = 0, helps = 0;
  for (size_t at = 0; (at = t.find("# TYPE ", at)) != std::string::npos; ++at) ++families;
  for (size_t at = 0; (at = t.find("# HELP ", at)) != std::string::npos; ++at) ++helps;
  EXPECT_TRUE(has_line(t, "dsgd_stragglers 1")) << t;
  const std::string a = "{worker=\"0\",host=\"node-a\",pid=\"101\",role=\"member\"}";
  EXPECT_TRUE(has_line(t, "dsgd_worker_compute_seconds_total" + a + " 7.5")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_worker_comm_wait_seconds_total" + a + " 0.25")) << t;
  EXPECT_TRUE(has_line(t, "dsgd_worker_straggler" + a + " 1")) << t;
  EXPECT_EQ(families, 19u);
  EXPECT_EQ(helps, families);
}

TEST(Metrics, TheServerAnswersEachScrapeWithWhatReadReturnsNow) {
  int64_t steps = 0;
  auto server = MetricsServer::start("127.0.0.1", 0, [&] {
    JobGauges g = two_workers();
    g.steps = ++steps;  // a new figure each scrape
    return g;
  });
  ASSERT_GT(server->port(), 0);
  httplib::Client client("127.0.0.1", server->port());
  for (int i = 1; i <= 2; ++i) {
    const auto res = client.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_NE(res->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
    EXPECT_TRUE(has_line(res->body, "dsgd_steps_total " + std::to_string(i))) << res->body;
  }
  EXPECT_EQ(server->scrapes(), 2);
  EXPECT_EQ(client.Get("/nothing")->status, 404);
  // The port is taken: a second server there says so, naming it.
  try {
    MetricsServer::start("127.0.0.1", server->port(), [] { return JobGauges{}; });
    FAIL() << "a second server listened on a port in use";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(server->port())), std::string::npos) << e.what();
  }
}

TEST(JobHistory, KeepsCurvesEventsAndTheWorkersNowAndThinsALongRun) {
  JobHistory h(nlohmann::json{{"strategy", "allreduce"}});
  for (int i = 0; i < static_cast<int>(JobHistory::kMaxPoints) + 10; ++i) h.add_train(i * 0.5, i, 2.0 - i * 1e-4, 400);
  h.add_validation(10, 20, 1.5, 0.75);
  h.add_event(11, 21, "recovery", "worker 1 lost");
  const auto j = nlohmann::json::parse(h.to_json(two_workers(), /*ended=*/true));
  EXPECT_EQ(j["settings"]["strategy"], "allreduce");
  EXPECT_LE(j["train"].size(), JobHistory::kMaxPoints);
  EXPECT_GT(j["train"].size(), JobHistory::kMaxPoints / 2);
  EXPECT_EQ(j["train"].back()[1], static_cast<int>(JobHistory::kMaxPoints) + 9);  // the newest kept
  EXPECT_EQ(j["validation"][0][3], 0.75);
  EXPECT_EQ(j["events"][0]["kind"], "recovery");
  EXPECT_EQ(j["workers"].size(), 2u);
  EXPECT_TRUE(j["ended"]);
}

TEST(JobHistory, TheDashboardServesThePageChartJsAndTheHistoryLiveAndFromItsFile) {
  JobHistory h(nlohmann::json{{"strategy", "ps"}});
  h.add_train(1, 10, 1.0, 300);
  auto live = MetricsServer::start("127.0.0.1", 0, [] { return two_workers(); },
                                   [&] { return h.to_json(two_workers(), false); });
  httplib::Client client("127.0.0.1", live->port());
  const auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("<canvas id=\"loss\">"), std::string::npos);
  const auto js = client.Get("/chart.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->status, 200) << "libjs-chart.js is not installed (scripts/install-deps.sh installs it)";
  EXPECT_GT(js->body.size(), 100000u);
  EXPECT_EQ(nlohmann::json::parse(client.Get("/history.json")->body)["train"][0][1], 10);

  const auto dir = std::filesystem::temp_directory_path() / ("dsgd-history-" + std::to_string(::getpid()));
  EXPECT_THROW(dsgd::DashboardServer(dir.string(), "127.0.0.1", 0), ConfigError);  // nothing written yet
  h.write(dir.string(), two_workers(), /*ended=*/true);
  dsgd::DashboardServer after(dir.string(), "127.0.0.1", 0);
  httplib::Client viewer("127.0.0.1", after.port());
  EXPECT_TRUE(nlohmann::json::parse(viewer.Get("/history.json")->body)["ended"]);
  EXPECT_EQ(viewer.Get("/metrics")->status, 404);  // no live job behind a file
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsgd::runtime
