// An attacker on this process's and its children's listening ports, for the security tests:
// every few milliseconds it looks for the ports again (Gloo's are open only while a group
// forms) and on each it opens a half-open connection (held until stop, up to 200), sends 4 KiB
// of garbage and leaves, and makes a port scan's probe (connect, close).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "testing/sockets.h"

namespace dsgd::testing {

inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class PortAttacker {
 public:
  PortAttacker() : thread_([this] { run(); }) {}
  ~PortAttacker() { stop(); }

  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (int fd : half_open_) ::close(fd);
    half_open_.clear();
  }

  // Valid after stop().
  int attacks() const { return attacks_; }
  size_t ports() const { return ports_.size(); }
  size_t half_open() const { return held_; }
  int exposed() const { return exposed_; }  // listeners seen beyond loopback

 private:
  void run() {
    std::mt19937 rng(1);
    std::string garbage(4096, '\0');
    while (!stop_) {
      std::vector<Listener> all = listeners(::getpid());
      for (pid_t child : children_of(::getpid())) {
        for (const auto& l : listeners(child)) all.push_back(l);
      }
      for (const auto& l : all) {
        ports_.insert(l.port);
        if (!l.loopback) ++exposed_;
        if (half_open_.size() < 200) {
          if (const int fd = connect_loopback(l.port); fd >= 0) half_open_.push_back(fd);
          held_ = std::max(held_, half_open_.size());
        }
        for (auto& c : garbage) c = static_cast<char>(rng());
        if (const int fd = connect_loopback(l.port); fd >= 0) {
          (void)!::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
          ::close(fd);
        }
        if (const int fd = connect_loopback(l.port); fd >= 0) ::close(fd);
        ++attacks_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> attacks_{0};
  std::atomic<int> exposed_{0};
  std::set<int> ports_;         // touched by the thread only until stop()
  std::vector<int> half_open_;  // likewise
  size_t held_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace dsgd::testing
