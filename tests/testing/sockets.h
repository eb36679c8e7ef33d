// TCP ports a process listens on (from /proc), for tests that probe a job's ports.
#pragma once

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing/proc.h"

namespace dsgd::testing {

struct Listener {
  int port = 0;
  bool loopback = false;  // bound to 127.0.0.0/8 or ::1 (not a wildcard or external address)
};

// The TCP sockets (IPv4 and IPv6) on which process `pid` listens.
inline std::vector<Listener> listeners(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;  // of the process's sockets
  if (DIR* d = ::opendir((proc + "/fd").c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const ssize_t n = ::readlink((proc + "/fd/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      const std::string t(target, static_cast<size_t>(n));
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<Listener> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
      const std::string address = local.substr(0, local.find(':'));
      Listener l;
      l.port = std::stoi(local.substr(local.find(':') + 1), nullptr, 16);
      // Hex, 32-bit words in host (little-endian) order: 127.x.x.x is "......7F"; ::1 is
      // 00000000 00000000 00000000 01000000; ::ffff:127.x.x.x (IPv4-mapped) 0..0 FFFF0000 ......7F.
      const bool v4 = address.size() == 8 && address.substr(6) == "7F";
      const bool mapped = address.size() == 32 && address.substr(0, 24) == "0000000000000000FFFF0000" &&
                          address.substr(30) == "7F";
      l.loopback = v4 || mapped || address == "00000000000000000000000001000000";
      out.push_back(l);
    }
  }
  return out;
}

// Processes whose parent is `parent` (from /proc/*/stat), but for its fork servers
// (runtime/launch/fork_server.h): they start workers, they are none.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const std::string stat = read_proc(std::string("/proc/") + e->d_name + "/stat");
      const size_t close = stat.rfind(')');  // the command may contain spaces and parentheses
      if (close == std::string::npos) continue;
      std::istringstream f(stat.substr(close + 1));
      std::string state;
      pid_t ppid = 0;
      f >> state >> ppid;
      if (ppid != parent) continue;
      const std::string cmd = read_proc(std::string("/proc/") + e->d_name + "/cmdline");
      if (cmd.find("--dsgd-fork-server") == std::string::npos) out.push_back(static_cast<pid_t>(std::stoi(e->d_name)));
    }
    ::closedir(d);
  }
  return out;
}

}  // namespace dsgd::testing
