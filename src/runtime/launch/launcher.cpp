#include "runtime/launch/launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "dsgd/common/error.h"
#include "control/log.h"

namespace dsgd::runtime {

dsgd::Launcher launcher_of(const TrainerConfig& c) {
  const dsgd::Launcher l = c.launch.launcher.value();
  if (l != Launcher::kAuto) return l;
  return c.launch.listen.empty() ? Launcher::kLocal : Launcher::kNone;
}

namespace {

void require(bool ok, const char* field, const std::string& what) {
  if (!ok) throw ConfigError(what, field);
}

void validate_tls(const TrainerConfig& c) {
  const int files = !c.launch.tls_ca.empty() + !c.launch.tls_cert.empty() + !c.launch.tls_key.empty();
  require(files == 0 || files == 3, "launch.tls_ca",
          "launch.tls_ca, tls_cert and tls_key go together (--tls-dir DIR reads ca.pem, cert.pem and key.pem); got " +
              std::to_string(files) + " of the 3");
  require(c.launch.tls != Tls::kOff || files == 0, "launch.tls",
          "launch.tls is off, yet TLS key files are given: leave out one or the other");
  require(c.launch.tls != Tls::kOn || files == 3 || starts_every_process(c), "launch.tls",
          "launch.tls on: the workers of this job join by themselves (launcher '" + c.launch.launcher.name() +
              "'" + (c.launch.listen.empty() ? "" : " with listen") +
              "), so the driver cannot hand them keys of its own: make a CA and a certificate of it with "
              "`dsgd tls-keys DIR`, and give DIR to the driver and every worker (--tls-dir DIR)");
}

}  // namespace

bool starts_every_process(const TrainerConfig& c) {
  switch (launcher_of(c)) {
    case Launcher::kLocal: return c.launch.listen.empty();
    case Launcher::kSsh:
    case Launcher::kMpirun:
    case Launcher::kSlurm: return true;
    default: return false;
  }
}

control::TlsKeys job_tls_keys(const TrainerConfig& c) {
  if (c.launch.tls == Tls::kOff) return {};
  if (!c.launch.tls_ca.empty()) return control::load_keys(c.launch.tls_ca, c.launch.tls_cert, c.launch.tls_key);
  if (starts_every_process(c)) return control::make_job_keys();
  const std::string host = reachable_listen_host(c);
  if (host.rfind("127.", 0) != 0 && host != "localhost") {
    control::log().warn("driver: the control plane is not encrypted: workers join by themselves, so the token and "
                        "the pairs' secrets cross the network in the clear. Make keys with `dsgd tls-keys DIR` and "
                        "give DIR to the driver and every worker (--tls-dir DIR), or say --no-tls");
  }
  return {};
}

void validate_launcher(const TrainerConfig& c) {
  const dsgd::Launcher launcher = launcher_of(c);
  const std::string name = c.launch.launcher.name();
  validate_tls(c);
  const bool ssh = launcher == Launcher::kSsh, mpirun = launcher == Launcher::kMpirun;
  require(ssh || mpirun || c.launch.hosts.empty(), "launch.hosts",
          "hosts are where launcher ssh or mpirun starts workers; launcher is '" + name +
              "' (set launcher ssh or mpirun, or leave hosts out)");
  require(
      launcher == Launcher::kLocal || c.launch.local_hosts == 1, "launch.local_hosts",
      "launch.local_hosts spreads workers the driver starts on this host (launcher local); launcher is '" + name + "'");
  require(launcher != Launcher::kNone || !c.launch.listen.empty(), "launch.listen",
          "launcher none: the workers join over TCP, so the driver needs listen (HOST:PORT)");
  if (!ssh && !mpirun && launcher != Launcher::kSlurm) return;
  require(!mpirun || ps_shard_processes(c) == 0, "ps.placement",
          "launcher mpirun starts the workers only: use ps.placement workers, or start each ps shard with dsgd "
          "ps-server");
  if (launcher == Launcher::kSlurm) {
    const char* job = std::getenv("SLURM_JOB_ID");
    require(job != nullptr && *job != '\0', "launch.launcher",
            "launcher slurm starts each worker as a job step of this Slurm allocation, but SLURM_JOB_ID is not set: "
            "run the driver inside one (sbatch, or salloc; examples/slurm/train.sbatch)");
    require(c.launch.srun_command.find_first_not_of(" \t") != std::string::npos, "launch.srun_command",
            "launch.srun_command is empty (default: srun)");
    require(!reachable_listen_host(c).empty(), "launch.listen",
            "launcher slurm tells each worker the driver's address: set listen to HOST:PORT with a HOST the nodes "
            "reach (not 0.0.0.0; examples/slurm/train.sbatch uses its node's address), got '" + c.launch.listen + "'");
    return;
  }
  require(!ssh || !c.launch.hosts.empty(), "launch.hosts",
          "launcher ssh needs hosts (\"host\" or \"host:slots\"; dsgd train --hosts FILE)");
  require(!mpirun || !c.recovery.wait_for_replacements, "recovery.wait_for_replacements",
          "launcher mpirun starts every worker at once and cannot start a replacement: leave "
          "recovery.wait_for_replacements "
          "off (the job goes on with the survivors)");
  const auto& command = ssh ? c.launch.ssh_command : c.launch.mpirun_command;
  require(command.find_first_not_of(" \t") != std::string::npos, ssh ? "launch.ssh_command" : "launch.mpirun_command",
          std::string(ssh ? "launch.ssh_command" : "launch.mpirun_command") +
              " is empty (default: " + (ssh ? "ssh" : "mpirun") + ")");
  if (c.launch.hosts.empty()) return;  // mpirun on this host
  const auto hosts = parse_hosts(c.launch.hosts);
  int slots = 0;
  for (const auto& h : hosts) slots += h.slots;
  const int processes = worker_processes(c) + (mpirun ? 0 : ps_shard_processes(c));
  require(slots >= processes, "launch.hosts",
          "launcher " + name + ": the hosts have " + std::to_string(slots) + " slot(s) for " +
              std::to_string(processes) +
              " worker(s), standbys and ps shard processes; add "
              "hosts or slots");
  require(!reachable_listen_host(c).empty(), "launch.listen",
          "launcher " + name + " tells each worker the driver's address: set listen to HOST:PORT with a HOST the "
          "hosts reach (not 0.0.0.0), got '" + c.launch.listen + "'");
}


std::vector<HostSlots> parse_hosts(const std::vector<std::string>& entries) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  for (const auto& entry : entries) {
    const auto colon = entry.rfind(':');
    HostSlots h;
    h.name = entry.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string slots = entry.substr(colon + 1);
      size_t used = 0;
      long n = 0;
      try {
        n = std::stol(slots, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (slots.empty() || used != slots.size() || n < 1 || n > 4096) {
        throw ConfigError("hosts: '" + entry + "': slots must be a whole number in 1..4096 (\"host:slots\")");
      }
      h.slots = static_cast<int>(n);
    }
    if (h.name.empty()) throw ConfigError("hosts: '" + entry + "' names no host");
    for (const char ch : h.name) {
      const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' ||
                      ch == '@';
      if (!ok) {
        throw ConfigError("hosts: '" + entry +
                          "': a host name holds letters, digits and . - _ @ only (ssh would read '" +
                          std::string(1, ch) + "' otherwise)");
      }
    }
    if (!seen.insert(h.name).second) {
      throw ConfigError("hosts: '" + h.name + "' is named twice; give it once, with its slots (\"" + h.name + ":2\")");
    }
    hosts.push_back(h);
  }
  return hosts;
}

std::string reachable_listen_host(const TrainerConfig& c) {
  if (c.launch.listen.empty()) return "";
  const std::string h = c.launch.listen.substr(0, c.launch.listen.rfind(':'));
  return h == "0.0.0.0" || h == "[::]" || h == "::" ? "" : h;
}

std::string driver_address(const TrainerConfig& c, int port) {
  const std::string host = reachable_listen_host(c);
  return (host.empty() ? "127.0.0.1" : host) + ":" + std::to_string(port);
}

namespace {

// `s` as one word to a POSIX shell.
std::string shell_word(const std::string& s) {
  std::string q = "'";
  for (const char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// More than kCrowdedWorkersPerCore local workers a core: each runs at kCrowdedWorkerNice below the
// driver, which shares the machine with them and which every one of them needs to hear from. With
// 129 workers starting on 2 cores at equal priority the driver answered heartbeats too late and
// workers gave up on it; at nice 5 it gets 3x a worker's share of the CPU when it needs it, and
// nothing when it does not. A job of a few workers a core keeps their priority: niced, they lost
// to other programs' processes on a busy machine (a 3-process job beside another ran 3x slower).
constexpr int kCrowdedWorkersPerCore = 8;
constexpr int kCrowdedWorkerNice = 5;

class LocalLauncher : public ProcessLauncher {
 public:
  LocalLauncher(const TrainerConfig& c, LocalProcesses& processes, JobSecrets secrets)
      : processes_(processes),
        secrets_(std::move(secrets)),
        nice_(c.num_workers + c.recovery.standby_workers >
                      kCrowdedWorkersPerCore * static_cast<int>(std::thread::hardware_concurrency())
                  ? kCrowdedWorkerNice
                  : 0) {
    processes_.use_fork_servers();
  }
  const char* name() const override { return "local"; }
  pid_t start(const std::string& binary, std::vector<std::string> args, std::vector<std::string> env) override {
    for (auto& e : secrets_.environment()) env.push_back(std::move(e));
    return processes_.spawn(binary, args, env, {}, SIGKILL, nice_);
  }

 private:
  LocalProcesses& processes_;
  const JobSecrets secrets_;
  const int nice_;
};

class SshLauncher : public ProcessLauncher {
 public:
  SshLauncher(const TrainerConfig& c, LocalProcesses& processes, JobSecrets secrets)
      : processes_(processes), secrets_(std::move(secrets)), hosts_(parse_hosts(c.launch.hosts)) {
    ssh_ = words_of(c.launch.ssh_command);
  }
  const char* name() const override { return "ssh"; }

  pid_t start(const std::string& binary, std::vector<std::string> args, std::vector<std::string> env) override {
    const std::string host = pick();
    args.insert(args.end(), {"--host-id", host});
    const pid_t pid = processes_.spawn(ssh_.at(0), ssh_arguments(ssh_, host, binary, args, env), {}, secrets_.input());
    host_[pid] = host;
    return pid;
  }

  void released(pid_t pid, bool failed, const std::string&) override {
    const auto it = host_.find(pid);
    if (it == host_.end()) return;
    if (failed) avoided_.insert(it->second);
    host_.erase(it);
  }

  std::string host_of(pid_t pid) const override {
    const auto it = host_.find(pid);
    return it == host_.end() ? std::string() : it->second;
  }

 private:
  // The host with a free slot that lost no worker and runs the fewest (in the file's order on a
  // tie); a host that lost one only when no other has room.
  std::string pick() const {
    const HostSlots* best = nullptr;
    int best_used = 0;
    bool best_avoided = true;
    for (const auto& h : hosts_) {
      const int used = static_cast<int>(
          std::count_if(host_.begin(), host_.end(), [&](const auto& e) { return e.second == h.name; }));
      if (used >= h.slots) continue;
      const bool avoided = avoided_.count(h.name) > 0;
      if (best == nullptr || (best_avoided && !avoided) || (avoided == best_avoided && used < best_used)) {
        best = &h;
        best_used = used;
        best_avoided = avoided;
      }
    }
    if (best == nullptr) {
      throw Error("ssh launcher: every slot of the hosts is taken (" + std::to_string(host_.size()) +
                  " worker(s) running); add hosts or slots");
    }
    return best->name;
  }

  LocalProcesses& processes_;
  const JobSecrets secrets_;
  const std::vector<HostSlots> hosts_;
  std::vector<std::string> ssh_;
  std::map<pid_t, std::string> host_;  // running ssh clients
  std::set<std::string> avoided_;      // hosts that lost a worker
};

class MpirunLauncher : public ProcessLauncher {
 public:
  MpirunLauncher(const TrainerConfig& c, LocalProcesses& processes, JobSecrets secrets)
      : processes_(processes),
        secrets_(std::move(secrets)),
        hosts_(parse_hosts(c.launch.hosts)),
        command_(words_of(c.launch.mpirun_command)) {}
  const char* name() const override { return "mpirun"; }
  pid_t start(const std::string&, std::vector<std::string>, std::vector<std::string>) override {
    throw Error("launcher mpirun starts every worker at once and cannot start another");
  }
  bool starts_all_at_once() const override { return true; }
  pid_t start_all(const std::string& binary, const std::vector<std::string>& args, std::vector<std::string> env,
                  int count) override {
    if (!secrets_.tls.empty()) env.push_back(std::string("DSGD_TLS=") + secrets_.tls);
    const auto argv = mpirun_arguments(command_, hosts_, binary, args, env, count);
    env.push_back("DSGD_TOKEN=" + secrets_.token);  // -x exports it from mpirun's environment
    return processes_.spawn(command_.at(0), argv, env);
  }

 private:
  LocalProcesses& processes_;
  const JobSecrets secrets_;
  const std::vector<HostSlots> hosts_;
  const std::vector<std::string> command_;
};

class SlurmLauncher : public ProcessLauncher {
 public:
  SlurmLauncher(const TrainerConfig& c, LocalProcesses& processes, JobSecrets secrets)
      : processes_(processes), secrets_(std::move(secrets)), srun_(words_of(c.launch.srun_command)) {
    const char* job = std::getenv("SLURM_JOB_ID");
    job_ = job != nullptr ? job : "";
    const char* nodes = std::getenv("SLURM_JOB_NUM_NODES");
    nodes_ = nodes != nullptr ? std::atoi(nodes) : 0;
  }
  const char* name() const override { return "slurm"; }

  pid_t start(const std::string& binary, std::vector<std::string> args, std::vector<std::string> env) override {
    std::vector<std::string> exclude = avoided_;
    if (!avoided_.empty()) {
      // Slurm (22.05) leaves a step pending when its --exclude keeps a node that is busy in the
      // running: so the nodes our workers run on are excluded too, while that leaves a node.
      std::vector<std::string> busy = avoided_;
      for (const auto& [pid, host] : placed_) {
        if (std::find(busy.begin(), busy.end(), host) == busy.end()) busy.push_back(host);
      }
      if (nodes_ == 0 || static_cast<int>(busy.size()) < nodes_) exclude = busy;
    }
    // srun passes its environment on to the step (--export=ALL, Slurm's default).
    const pid_t pid =
        processes_.spawn(srun_.at(0), srun_arguments(srun_, exclude, binary, args), env, secrets_.input(), SIGTERM);
    excluded_[pid] = exclude;
    return pid;
  }

  void placed(pid_t pid, const std::string& host) override {
    if (!host.empty() && excluded_.count(pid) != 0) placed_[pid] = host;
  }

  void released(pid_t pid, bool failed, const std::string& host) override {
    excluded_.erase(pid);
    placed_.erase(pid);
    if (!failed || host.empty() || std::find(avoided_.begin(), avoided_.end(), host) != avoided_.end()) return;
    avoided_.push_back(host);
    // Every node of the allocation avoided would leave no node for a step: forget the oldest.
    const size_t keep = nodes_ > 1 ? static_cast<size_t>(nodes_ - 1) : 1;
    while (avoided_.size() > keep) avoided_.erase(avoided_.begin());
  }

  std::string host_of(pid_t pid) const override {
    std::string where = "a node of Slurm job " + job_;
    const auto it = excluded_.find(pid);
    if (it == excluded_.end() || it->second.empty()) return where;
    where += " but ";
    for (size_t i = 0; i < it->second.size(); ++i) where += (i > 0 ? "," : "") + it->second[i];
    return where;
  }

 private:
  LocalProcesses& processes_;
  const JobSecrets secrets_;
  const std::vector<std::string> srun_;
  std::string job_;
  int nodes_ = 0;                                  // in the allocation; 0: unknown
  std::vector<std::string> avoided_;               // nodes that lost a worker, oldest first
  std::map<pid_t, std::vector<std::string>> excluded_;  // running sruns: the nodes each excluded
  std::map<pid_t, std::string> placed_;                 // running sruns: their worker's node, once known
};

}  // namespace

std::vector<std::string> JobSecrets::environment() const {
  std::vector<std::string> out{"DSGD_TOKEN=" + token};
  if (!tls.empty()) out.push_back("DSGD_TLS=" + tls);
  return out;
}

std::string JobSecrets::input() const { return token + "\n" + tls + "\n"; }

pid_t ProcessLauncher::start_all(const std::string&, const std::vector<std::string>&, std::vector<std::string>, int) {
  throw Error(std::string("launcher ") + name() + " starts workers one at a time");
}

std::vector<std::string> words_of(const std::string& command) {
  std::vector<std::string> out;
  std::istringstream words(command);
  for (std::string w; words >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> mpirun_arguments(const std::vector<std::string>& mpirun_command,
                                          const std::vector<HostSlots>& hosts, const std::string& binary,
                                          const std::vector<std::string>& args, const std::vector<std::string>& env,
                                          int count) {
  std::vector<std::string> out(mpirun_command.begin() + 1, mpirun_command.end());
  out.insert(out.end(), {"-np", std::to_string(count), "-x", "DSGD_TOKEN"});
  for (const auto& e : env) out.insert(out.end(), {"-x", e.substr(0, e.find('='))});
  // Open MPI 4: a rank that dies does not take the others with it (the job goes on with fewer).
  out.insert(out.end(), {"--mca", "orte_abort_on_non_zero_status", "0"});
  if (!hosts.empty()) {
    std::string list;
    for (const auto& h : hosts) list += (list.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
    out.insert(out.end(), {"--host", list});
  }
  out.push_back(binary);
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

std::vector<std::string> srun_arguments(const std::vector<std::string>& srun_command,
                                        const std::vector<std::string>& exclude, const std::string& binary,
                                        const std::vector<std::string>& args) {
  std::vector<std::string> out(srun_command.begin() + 1, srun_command.end());
  out.insert(out.end(), {"--nodes=1", "--ntasks=1", "--exclusive", "--job-name=dsgd-worker"});
  if (!exclude.empty()) {
    std::string list;
    for (const auto& node : exclude) list += (list.empty() ? "" : ",") + node;
    out.push_back("--exclude=" + list);
  }
  // srun hands its standard input to the task; srun's end (SIGTERM) cancels the step.
  out.insert(out.end(), {"/bin/sh", "-c",
                         "IFS= read -r DSGD_TOKEN || exit 125; IFS= read -r DSGD_TLS || exit 125; "
                         "export DSGD_TOKEN; [ -z \"$DSGD_TLS\" ] || export DSGD_TLS; "
                         "exec \"$@\" --host-id \"$SLURMD_NODENAME\" </dev/null",
                         "dsgd-worker", binary});
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

std::vector<std::string> ssh_arguments(const std::vector<std::string>& ssh_command, const std::string& host,
                                       const std::string& binary, const std::vector<std::string>& args,
                                       const std::vector<std::string>& env) {
  // The remote shell reads the secrets, starts the worker with its input closed, and keeps reading
  // its own input: at its end (the ssh client killed, or the driver gone) it kills the worker;
  // when the worker exits first, the client exits with its status.
  std::string script = "IFS= read -r DSGD_TOKEN || exit 125; IFS= read -r DSGD_TLS || exit 125; "
                       "export DSGD_TOKEN; [ -z \"$DSGD_TLS\" ] || export DSGD_TLS;";
  for (const auto& e : env) script += " export " + shell_word(e) + ";";
  script += " exec 3<&0; " + shell_word(binary);
  for (const auto& a : args) script += " " + shell_word(a);
  script += " </dev/null 3<&- & w=$!;"
            " ( while IFS= read -r _ <&3; do :; done; kill -KILL $w ) >/dev/null 2>&1 & c=$!;"
            " wait $w; s=$?; kill -KILL $c 2>/dev/null; exit $s";
  std::vector<std::string> out(ssh_command.begin() + 1, ssh_command.end());
  out.insert(out.end(), {"-o", "BatchMode=yes", "-T", host, "--", "sh -c " + shell_word(script)});
  return out;
}

std::unique_ptr<ProcessLauncher> make_launcher(const TrainerConfig& c, LocalProcesses& processes,
                                               const JobSecrets& secrets) {
  switch (launcher_of(c)) {
    case Launcher::kLocal:
      return std::make_unique<LocalLauncher>(c, processes, secrets);
    case Launcher::kSsh:
      return std::make_unique<SshLauncher>(c, processes, secrets);
    case Launcher::kMpirun:
      return std::make_unique<MpirunLauncher>(c, processes, secrets);
    case Launcher::kSlurm:
      return std::make_unique<SlurmLauncher>(c, processes, secrets);
    default:
      return nullptr;
  }
}

}  // namespace dsgd::runtime

namespace dsgd {

std::vector<std::string> read_hosts_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("hosts file '" + path + "' cannot be read");
  std::vector<std::string> entries;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string word, extra;
    if (!(words >> word)) continue;
    if (words >> extra) {
      throw ConfigError("hosts file '" + path + "': '" + line + "': one host a line (\"host\" or \"host:slots\")");
    }
    entries.push_back(word);
  }
  if (entries.empty()) throw ConfigError("hosts file '" + path + "' names no host");
  return entries;
}

}  // namespace dsgd
