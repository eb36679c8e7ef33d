// The driver's metrics endpoint (--metrics-port) scraped during a job as Prometheus would: parsed
// by python3-prometheus-client's parser (tests/tools/scrape_metrics.py), with the job's workers,
// its standby and its steps in it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_dsgd.h"
#include "testing/temp_dir.h"

namespace {

using dsgd::testing::free_port;
using dsgd::testing::read_file;

TEST(CliMetrics, TheEndpointParsesAsPrometheusTextDuringAJob) {
  dsgd::testing::TempDir dir;
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  const std::string train = std::string(DSGD_BINARY) +
                          " train --model cnn --dataset synthetic --synthetic-samples 3200 --batch-size 32 "
                          "--workers 2 --standby 1 --threads 1 --epochs 1 --checkpoint-every 10 --no-eval --quiet "
                          "--metrics-port " + std::to_string(port) + " > " + dir.file("run.json") + " 2> " +
                          dir.file("err.txt");
  const std::string scrape = "/usr/bin/python3 " DSGD_SOURCE_DIR "/tests/tools/scrape_metrics.py " + url +
                             " 90 1 > " + dir.file("scrape.json") + " 2> " + dir.file("scrape.err");
  const std::string both = train + " & " + scrape + "; s=$?; wait $!; j=$?; echo $s $j > " + dir.file("rc");
  ASSERT_EQ(std::system(("bash -c '" + both + "'").c_str()), 0);
  std::istringstream rc(read_file(dir.file("rc")));
  int scrape_rc = -1, job_rc = -1;
  rc >> scrape_rc >> job_rc;
  ASSERT_EQ(scrape_rc, 0) << read_file(dir.file("scrape.err")) << read_file(dir.file("err.txt"));
  EXPECT_EQ(job_rc, 0) << read_file(dir.file("err.txt"));

  const auto j = nlohmann::json::parse(read_file(dir.file("scrape.json")));
  std::map<std::string, double> job;
  std::map<std::string, int> series, role_count;
  for (const auto& s : j["samples"]) {
    const std::string name = s["name"];
    ++series[name];
    if (s["labels"].empty()) job[name] = s["value"];
    if (name == "dsgd_worker_step_seconds") {
      ++role_count[s["labels"]["role"].get<std::string>()];
      if (s["labels"]["role"] == "member") {
        EXPECT_GT(s["value"].get<double>(), 0) << s;
      }
      EXPECT_FALSE(s["labels"]["host"].get<std::string>().empty()) << s;
      EXPECT_GT(std::stoll(s["labels"]["pid"].get<std::string>()), 0) << s;
    }
  }
  EXPECT_GT(job["dsgd_steps_total"], 0);
  EXPECT_EQ(job["dsgd_samples_total"], 32 * job["dsgd_steps_total"]);
  EXPECT_GT(job["dsgd_samples_per_second"], 0);
  EXPECT_EQ(job["dsgd_workers"], 2);
  EXPECT_EQ(job["dsgd_standbys"], 1);
  EXPECT_EQ(job["dsgd_recoveries_total"], 0);
  EXPECT_GT(job["dsgd_uptime_seconds"], 0);
  // Three registrations, their rendezvous, commands and heartbeats at the least.
  EXPECT_GT(job["dsgd_control_calls_total"], 3 * 4);
  EXPECT_EQ(role_count["member"], 2);
  EXPECT_EQ(role_count["standby"], 1);
  // Live from the heartbeats (up to a beat, 1 s, behind), where the counter waits for a chunk's end.
  EXPECT_GT(job["dsgd_step"], 0);
  for (const char* name : {"dsgd_worker_step", "dsgd_worker_loss", "dsgd_worker_heartbeat_age_seconds"}) {
    EXPECT_EQ(series[name], 3) << name;
  }
  EXPECT_EQ(j["types"]["dsgd_steps"], "counter");
  EXPECT_EQ(j["types"]["dsgd_workers"], "gauge");
}

}  // namespace
