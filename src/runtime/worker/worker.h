// The worker process: registers with the driver, then runs the driver's commands (setup,
// connect, train, validate, state, worker functions) on its replicas until told to stop.
//
//   if (auto args = dsgd::runtime::parse_worker_args(argc, argv)) std::exit(dsgd::run_worker(*args));
//
// A heartbeat thread reports progress; when the driver says stop, or cannot be reached for the
// heartbeat timeout, the process exits (it never outlives its job). Workers spawned locally also
// die with the driver (PR_SET_PDEATHSIG). A job whose driver restarts in place (JobSpec's
// driver_grace_ms) is the exception: its workers outlive the driver, and wait that long for a
// driver to answer at its address again before they exit.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "dsgd/runtime/remote.h"
#include "control/tls.h"

namespace dsgd::runtime {

// Worker mode is `--dsgd-worker` anywhere in argv. Returns nullopt otherwise; ConfigError for
// bad worker flags (--driver missing, no token).
std::optional<WorkerArgs> parse_worker_args(int argc, char** argv);

// The TLS keys of a process joining a driver: the three files' when given, else $DSGD_TLS's, else
// none. ConfigError for unreadable or mismatched keys.
control::TlsKeys worker_tls_keys(const std::string& ca_file, const std::string& cert_file,
                                 const std::string& key_file);

// The local address the kernel would use to reach `driver` (HOST:PORT): what a process binds for
// Gloo so that its peers can reach it. A UDP connect sends nothing.
std::string route_address(const std::string& driver);
// This machine's host name.
std::string host_name();

}  // namespace dsgd::runtime
