// Worker processes the driver starts on this host: fork + exec of a binary, with the job token
// in the environment (not on the command line, where `ps` shows it), killed with the driver
// (PR_SET_PDEATHSIG), and reaped. Torch-free.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

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
  void reaped(size_t i);  // marks child i reaped and closes its standard input
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::vector<int> stdin_fds_;  // -1: none
  std::vector<int> stop_signals_;
  std::chrono::steady_clock::time_point all_running_at_ = std::chrono::steady_clock::now();
};

// This process's executable (/proc/self/exe).
std::string self_executable();

}  // namespace dsgd::runtime
