// Runs the built `dsgd` binary (DSGD_BINARY) as a user would, for the command-line tests.
//
//   CliRun r = run_dsgd("train --help");          // or run_command("any shell line 2>&1")
//   EXPECT_EQ(r.exit_code, 0) << r.output;
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "testing/ports.h"
#include <thread>
#include <vector>

#include "testing/proc.h"

namespace dsgd::testing {

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `command` under sh, stdout and stderr together as written (append "2>&1" for stderr).
inline CliRun run_command(const std::string& command) {
  CliRun r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CliRun run_dsgd(const std::string& args) { return run_command(std::string(DSGD_BINARY) + " " + args + " 2>&1"); }

// True once `pid` has exited (or is a zombie: exited, not yet reaped).
inline bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  const std::string line = read_proc("/proc/" + std::to_string(pid) + "/stat");
  const auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
}

// `dsgd COMMAND ARGS...` as a child process, its output thrown away (or appended to `log`).
inline pid_t start_dsgd(const std::string& command, const std::vector<std::string>& args,
                        const std::string& log = "/dev/null") {
  std::vector<const char*> argv{"dsgd", command.c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(DSGD_BINARY, const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  return pid;
}
inline pid_t start_train(const std::vector<std::string>& args, const std::string& log = "/dev/null") {
  return start_dsgd("train", args, log);
}

// The driver's worker processes now: its children but its fork server.
inline std::vector<pid_t> worker_children(pid_t driver) {
  std::vector<pid_t> workers;
  std::ifstream children("/proc/" + std::to_string(driver) + "/task/" + std::to_string(driver) + "/children");
  pid_t p;
  while (children >> p) {
    const std::string cmd = read_proc("/proc/" + std::to_string(p) + "/cmdline");
    if (cmd.find("--dsgd-fork-server") == std::string::npos) workers.push_back(p);  // not a worker: it forks them
  }
  return workers;
}

// The driver's worker processes, once `n` exist (empty after 30 s without them).
inline std::vector<pid_t> children_of(pid_t driver, size_t n) {
  std::vector<pid_t> workers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (workers.size() < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    workers = worker_children(driver);
  }
  return workers;
}

}  // namespace dsgd::testing
