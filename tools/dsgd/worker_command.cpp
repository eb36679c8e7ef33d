// `dsgd worker`: join a driver started with `dsgd train --listen HOST:PORT` (or any program whose
// Trainer has `listen` set) from another host. Runs the built-in operators.
#include <iostream>

#include "commands.h"
#include "dsgd/error.h"
#include "runtime/builtin_operators.h"
#include "runtime/worker.h"

namespace dsgd::cli {

void add_worker_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<runtime::WorkerArgs>();
  CLI::App* cmd = app.add_subcommand("worker", "Join a training job's driver as a worker (remote mode)");
  cmd->footer(
      "\nExample (driver on host A, worker on host B):\n"
      "  A$ dsgd train --workers 2 --listen 0.0.0.0:29500 --token s3cret\n"
      "  B$ dsgd worker --driver A:29500 --token s3cret\n"
      "The token may come from $DSGD_TOKEN instead of --token. The worker exits when the job ends,\n"
      "or when the driver has been unreachable for the job's heartbeat timeout.");
  cmd->add_option("--driver", args->driver, "The driver's HOST:PORT")->required();
  cmd->add_option("--token", args->token, "The job token (default: $DSGD_TOKEN)");
  cmd->add_option("--address", args->address, "Address peers reach this worker at (default: the one routing to the driver)");
  cmd->add_option("--host-id", args->host_id, "Host identity for shared memory (default: the host name)");
  cmd->callback([args, exit_code] {
    if (args->token.empty()) {
      if (const char* t = std::getenv("DSGD_TOKEN")) args->token = t;
    }
    if (args->token.empty()) {
      std::cerr << "dsgd worker: error: the job token is needed: --token T or $DSGD_TOKEN\n";
      *exit_code = kExitUsage;
      return;
    }
    runtime::register_builtin_operators();
    *exit_code = runtime::run_worker(*args);
  });
}

}  // namespace dsgd::cli
