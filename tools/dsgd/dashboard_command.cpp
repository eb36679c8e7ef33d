// `dsgd dashboard --metrics-dir DIR`: a job's dashboard from the history its driver wrote there
// (--metrics-dir), during the job or after it, until Ctrl-C.
#include <signal.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "dsgd/runtime/dashboard.h"
#include "dsgd/common/error.h"

namespace dsgd::cli {

void add_dashboard_command(CLI::App& app, int* exit_code) {
  auto dir = std::make_shared<std::string>();
  auto host = std::make_shared<std::string>("127.0.0.1");
  auto port = std::make_shared<int>(8080);
  CLI::App* cmd = app.add_subcommand("dashboard", "Serve a job's dashboard from its --metrics-dir");
  cmd->footer(
      "\nExample:\n"
      "  dsgd train --workers 2 --epochs 4 --metrics-dir runs/job1     # live: --metrics-port 0\n"
      "  dsgd dashboard --metrics-dir runs/job1                         # http://127.0.0.1:8080/\n"
      "The page draws loss and validation curves, samples/s, each worker's step time (stragglers in\n"
      "red), recoveries and stragglers, and the job's settings; it follows a running job.");
  cmd->add_option("--metrics-dir", *dir, "The job's --metrics-dir (its history.json)")->required();
  cmd->add_option("--host", *host, "The address to listen on (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", *port, "The port (0: any free one)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->callback([dir, host, port, exit_code] {
    // Ctrl-C and SIGTERM wait for sigwait below: blocked before the server's thread starts.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    try {
      DashboardServer server(*dir, *host, *port);
      std::cout << "dsgd dashboard: http://" << *host << ":" << server.port() << "/ (Ctrl-C to stop)" << std::endl;
      int sig = 0;
      sigwait(&stop, &sig);
    } catch (const ConfigError& e) {
      std::cerr << "dsgd dashboard: error: " << e.what() << "\n";
      *exit_code = kExitUsage;
    }
  });
}

}  // namespace dsgd::cli
