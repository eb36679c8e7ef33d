#include "runtime/launch/spawn.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

#include "dsgd/common/error.h"
#include "control/log.h"

extern char** environ;

namespace dsgd::runtime {

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error(std::string("cannot read /proc/self/exe: ") + std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

LocalProcesses::~LocalProcesses() { kill_all(); }

namespace {

// `name` if it holds a '/', else the first executable `name` in PATH.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  throw Error("cannot start '" + name + "': no such program in PATH (" + dirs + ")");
}

}  // namespace

pid_t LocalProcesses::spawn(const std::string& binary, const std::vector<std::string>& args,
                            const std::vector<std::string>& env, const std::string& stdin_data, int stop_signal,
                            int nice) {
  // Everything exec needs is built before fork: the child of a threaded process may only make
  // async-signal-safe calls.
  std::vector<std::string> argv_s{find_program(binary)};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool overridden = false;
    for (const auto& mine : env) {
      if (kv.compare(0, mine.find('=') + 1, mine, 0, mine.find('=') + 1) == 0) overridden = true;
    }
    if (!overridden) env_s.push_back(kv);
  }
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (stdin_data.empty()) {
    if (auto pid = fork_from_server(argv_s[0], args, env_s, stop_signal, nice)) return *pid;
  }
  int input[2] = {-1, -1};  // a socket rather than a pipe: send() without SIGPIPE
  if (!stdin_data.empty() && ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, input) != 0) {
    throw Error(std::string("cannot start a worker process: socketpair: ") + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    if (input[0] >= 0) ::close(input[0]), ::close(input[1]);
    throw Error(std::string("cannot start a worker process: fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: kill_all reaches whatever it starts, too
    ::prctl(PR_SET_PDEATHSIG, stop_signal);
    if (::getppid() != parent) ::_exit(126);
    if (input[1] >= 0 && ::dup2(input[1], 0) != 0) ::_exit(126);  // dup2 clears close-on-exec
    if (nice > 0) (void)!::nice(nice);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (input[1] >= 0) {
    ::close(input[1]);
    // A few bytes into an empty socket buffer: no wait. A child that is already gone is
    // reported by check_exited.
    (void)!::send(input[0], stdin_data.data(), stdin_data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  pids_.push_back(pid);
  reaped_.push_back(false);
  stdin_fds_.push_back(input[0]);
  stop_signals_.push_back(stop_signal);
  return pid;
}

std::optional<pid_t> LocalProcesses::fork_from_server(const std::string& binary, const std::vector<std::string>& args,
                                                      const std::vector<std::string>& env, int stop_signal, int nice) {
  if (!fork_servers_ || !fork_servers_enabled()) return std::nullopt;
  std::string key = binary;
  for (const auto& e : env) key += '\0' + e;
  auto it = servers_.find(key);
  if (it == servers_.end()) {
    if (servers_.size() >= kMaxForkServers) return std::nullopt;
    // Its start is a worker's (LibTorch loaded): seconds on a crowded machine.
    it = servers_.emplace(key, ForkServer::start(binary, env, std::chrono::seconds(60))).first;
  }
  if (!it->second) return std::nullopt;
  const auto pid = it->second->fork(args, stop_signal, nice);
  if (!pid) {
    control::log().warn("the fork server of {} (pid {}) stopped answering; workers start by exec from now on",
                        binary, it->second->pid());
    it->second.reset();
    return std::nullopt;
  }
  pids_.push_back(*pid);
  reaped_.push_back(false);
  stdin_fds_.push_back(-1);
  stop_signals_.push_back(stop_signal);
  return pid;
}

void LocalProcesses::adopt(pid_t pid, int stop_signal) {
  pids_.push_back(pid);
  reaped_.push_back(false);
  stdin_fds_.push_back(-1);
  stop_signals_.push_back(stop_signal);
  adopted_.resize(pids_.size(), false);
  adopted_.back() = true;
}

bool LocalProcesses::adopted(size_t i) const { return i < adopted_.size() && adopted_[i]; }

// An adopted process is not our child: gone when no process has its pid, or a zombie (its new
// parent has not reaped it yet).
static bool running(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

bool LocalProcesses::ended(size_t i, int* status) {
  if (adopted(i)) return !running(pids_[i]);
  return ::waitpid(pids_[i], status, WNOHANG) == pids_[i];
}

void LocalProcesses::reaped(size_t i) {
  reaped_[i] = true;
  if (stdin_fds_[i] >= 0) ::close(std::exchange(stdin_fds_[i], -1));
}

std::optional<LocalProcesses::Exit> LocalProcesses::check_exited() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    int status = 0;
    if (ended(i, &status)) {
      reaped(i);
      if (adopted(i)) {  // not our child: how it ended is its new parent's to know
        return Exit{pids_[i], "process " + std::to_string(pids_[i]) + " (started by an earlier driver) ended", true};
      }
      std::string how;
      if (WIFEXITED(status)) {
        how = "exited with status " + std::to_string(WEXITSTATUS(status));
        if (WEXITSTATUS(status) == 127) how += " (the worker binary could not be executed)";
      } else if (WIFSIGNALED(status)) {
        how = std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
              ::strsignal(WTERMSIG(status)) + ")";
      }
      return Exit{pids_[i], "process " + std::to_string(pids_[i]) + " " + how, WIFSIGNALED(status)};
    }
  }
  all_running_at_ = std::chrono::steady_clock::now();
  return std::nullopt;
}

bool LocalProcesses::gone(pid_t pid) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] != pid) continue;
    if (!reaped_[i] && ended(i, nullptr)) reaped(i);
    return reaped_[i];
  }
  return false;
}

void LocalProcesses::kill(pid_t pid) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] != pid || reaped_[i]) continue;
    if (adopted(i) && this->ended(i, nullptr)) {  // gone: its pid (and group) may be another's now
      reaped(i);
      continue;
    }
    bool ended = false;
    if (stop_signals_[i] != SIGKILL) {
      ::kill(pid, stop_signals_[i]);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!(ended = this->ended(i, nullptr)) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    ::kill(-pid, SIGKILL);  // its group: whatever it started, too
    if (!ended) {
      ::kill(pid, SIGKILL);
      if (adopted(i)) {  // gone within moments of SIGKILL; its parent reaps it
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!this->ended(i, nullptr) && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      } else {
        ::waitpid(pid, nullptr, 0);
      }
    }
    reaped(i);
  }
}

bool LocalProcesses::wait_all(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    bool all = true;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      if (ended(i, nullptr)) {
        reaped(i);
      } else {
        all = false;
      }
    }
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void LocalProcesses::kill_all(int grace_ms) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (!reaped_[i]) ::kill(pids_[i], SIGTERM);
  }
  if (!wait_all(grace_ms)) {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (!reaped_[i] && !(adopted(i) && ended(i, nullptr))) ::kill(-pids_[i], SIGKILL);
    }
    wait_all(10000);
  }
}

}  // namespace dsgd::runtime
