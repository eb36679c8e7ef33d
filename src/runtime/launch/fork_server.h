// A fork server: local worker processes started by fork instead of exec. Debian's LibTorch costs
// every new process about a second of CPU before main (339 shared objects mapped and relocated,
// the operator registry built); a driver starting 128 workers on 2 cores spent 90 s on it. The
// first local start execs the binary once more as a server (`--dsgd-fork-server`), which
// dsgd::init parks, single-threaded, with every library loaded and initialised; each worker is
// then a fork of it (milliseconds) that runs dsgd::init's worker path with its own arguments and
// the caller's standard streams. The server forks twice and the driver is the child subreaper
// for that moment, so a worker is the driver's child, reaped and killed as an exec'd one is.
//
// A server's environment is the whole environment its workers get (libraries read theirs as they
// load: OMP_NUM_THREADS, ...), so LocalProcesses keeps one server per binary and environment.
// What runs before dsgd::init in main() runs once in the server, not in each worker. Where the
// server cannot start (a binary that does not call dsgd::init) starts are exec's, as they are
// with DSGD_FORK_SERVER=0 in the driver's environment. Torch-free.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsgd::runtime {

class ForkServer {
 public:
  // Execs `binary` --dsgd-fork-server with `env` (the whole environment) and waits up to `timeout`
  // for it to be ready: nullptr if it exits or does not answer in time (it is killed then).
  static std::unique_ptr<ForkServer> start(const std::string& binary, const std::vector<std::string>& env,
                                           std::chrono::milliseconds timeout);
  ~ForkServer();  // the server ends (its workers do not)
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  // A worker running `args` (argv[1..]) with this process's standard streams, its own process
  // group, `stop_signal` when this process dies, `nice` below this process's priority: its pid,
  // a child of this process; nullopt if the server is gone (start with exec then).
  std::optional<pid_t> fork(const std::vector<std::string>& args, int stop_signal, int nice);

  pid_t pid() const { return pid_; }

 private:
  ForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_;
  int fd_;
};

// In dsgd::init: true if this process was started as a fork server.
bool is_fork_server(int argc, char** argv);

// The server's loop (dsgd::init, when is_fork_server): forks a worker per request, which calls
// `main` with its arguments and exits with what it returns. The server exits when its driver
// closes the connection or dies.
using ForkedMain = int (*)(int argc, char** argv);
[[noreturn]] void serve_forks(int argc, char** argv, ForkedMain main);

// True unless DSGD_FORK_SERVER is "0" in this process's environment now.
bool fork_servers_enabled();

}  // namespace dsgd::runtime
