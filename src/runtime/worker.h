// The worker process: registers with the driver, then runs the driver's commands (setup,
// connect, train, validate, state, worker functions) on its replicas until told to stop.
//
//   if (auto args = dsgd::runtime::parse_worker_args(argc, argv)) std::exit(dsgd::runtime::run_worker(*args));
//
// A heartbeat thread reports progress; when the driver says stop, or cannot be reached for the
// heartbeat timeout, the process exits (it never outlives its job). Workers spawned locally also
// die with the driver (PR_SET_PDEATHSIG).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "dsgd/trainer.h"

namespace dsgd::runtime {

struct WorkerArgs {
  std::string driver;          // HOST:PORT
  std::string token;           // --token, else $DSGD_TOKEN
  std::string address;         // address to bind for Gloo; "" = the one that routes to the driver
  std::string host_id;         // host identity for shared memory; "" = host name
  int64_t spawn_index = -1;
  std::chrono::milliseconds registration_timeout{60000};
};

// Worker mode is `--dsgd-worker` anywhere in argv. Returns nullopt otherwise; ConfigError for
// bad worker flags (--driver missing, no token).
std::optional<WorkerArgs> parse_worker_args(int argc, char** argv);

// Serves the job; returns the process exit code (0 after a normal shutdown).
int run_worker(const WorkerArgs& args);

// The local address the kernel would use to reach `driver` (HOST:PORT): what a process binds for
// Gloo so that its peers can reach it. A UDP connect sends nothing.
std::string route_address(const std::string& driver);
// This machine's host name.
std::string host_name();

}  // namespace dsgd::runtime
