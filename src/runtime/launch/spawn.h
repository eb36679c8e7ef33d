// Worker processes the driver starts on this host: fork + exec of a binary (or a fork of a fork
// server of it, runtime/launch/fork_server.h), with the job token in the environment (not on the
// command line, where `ps` shows it), killed with the driver (PR_SET_PDEATHSIG), and reaped.
// Torch-free.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/launch/fork_server.h"

namespace dsgd::runtime {

class LocalProcesses {
 public:
  LocalProcesses() = default;
  ~LocalProcesses();  // kill_all()
  LocalProcesses(const LocalProcesses&) = delete;
  LocalProcesses& operator=(const LocalProcesses&) = delete;

  // Starts `binary` (a path, or a name looked up in PATH) with `args` (argv[1..]) and `env`
  // ("NAME=value") added to this environment. With `stdin_data`, its standard input is a socket
  // that gets those bytes and stays open until the process is reaped (the end of it tells an ssh
  // client's remote side that the driver is gone); otherwise it inherits ours. `stop_signal`
  // ends it, from kill() and when the driver dies: SIGKILL, or a signal a process turns into a
  // clean end of what it started (SIGTERM for srun, which then cancels its job step). Throws
  // dsgd::Error if the binary is not found or fork fails (an exec failure shows as exit status 127).
  // `nice` > 0: it runs that much below this process's priority (nice(2)).
  pid_t spawn(const std::string& binary, const std::vector<std::string>& args, const std::vector<std::string>& env,
              const std::string& stdin_data = {}, int stop_signal = SIGKILL, int nice = 0);
  // From now on, spawn without stdin_data forks the process from a fork server of its binary and
  // environment where one starts (runtime/launch/fork_server.h), instead of exec: the same
  // process, a second's CPU sooner. Off by default; DSGD_FORK_SERVER=0 turns it off anywhere.
  void use_fork_servers() { fork_servers_ = true; }
  // Watches `pid`, a process an earlier driver started (recovery.driver_state_dir), as if it
  // were ours: its end is found (not reaped: it is not our child), `stop_signal` ends it.
  void adopt(pid_t pid, int stop_signal = SIGKILL);
  struct Exit {
    pid_t pid;
    std::string what;  // "process 123 exited with status 1"
    bool signaled = false;  // killed by a signal, rather than exited
  };
  // The first child found to have ended (reaped: reported once); nullopt if all run.
  std::optional<Exit> check_exited();
  // When check_exited last found every child running: a child reported since ended after it.
  std::chrono::steady_clock::time_point all_running_at() const { return all_running_at_; }
  // True if `pid` (one of ours) has exited; reaps it (check_exited will not report it again).
  bool gone(pid_t pid);
  // Its stop signal to `pid` (SIGKILL to its process group; another: up to 5 s to exit, then
  // SIGKILL to the group), then reaps it.
  void kill(pid_t pid);
  // SIGTERM, up to `grace_ms` to exit, then SIGKILL; reaps all.
  void kill_all(int grace_ms = 2000);
  // Waits up to `timeout_ms` for all to exit by themselves; true if they did.
  bool wait_all(int timeout_ms);
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  static constexpr size_t kMaxForkServers = 4;  // environments; beyond them, exec
  std::optional<pid_t> fork_from_server(const std::string& binary, const std::vector<std::string>& args,
                                        const std::vector<std::string>& env, int stop_signal, int nice);
  void reaped(size_t i);  // marks child i reaped and closes its standard input
  bool adopted(size_t i) const;
  // Whether process i has ended (a child: reaped here, *status set if given).
  bool ended(size_t i, int* status);
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::vector<int> stdin_fds_;  // -1: none
  std::vector<int> stop_signals_;
  std::vector<bool> adopted_;   // adopt()ed, not our children; shorter than pids_ where none is
  bool fork_servers_ = false;
  // By binary and environment; null: it did not start or went away (exec from then on).
  std::map<std::string, std::unique_ptr<ForkServer>> servers_;
  std::chrono::steady_clock::time_point all_running_at_ = std::chrono::steady_clock::now();
};

// This process's executable (/proc/self/exe).
std::string self_executable();

}  // namespace dsgd::runtime
