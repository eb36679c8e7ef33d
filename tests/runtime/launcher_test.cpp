// Launchers without a network: hosts entries and files, the launcher's config checks, the
// LocalProcesses standard input that carries the token, and the ssh launcher's remote script run
// by a stand-in for ssh (a local shell in a session of its own, fed by a pipe as sshd feeds the
// remote side): the token arrives on standard input and never on a command line, and the end of
// that input (the client killed) kills the worker. The slurm launcher's srun arguments, its
// choice of nodes to exclude (a stand-in srun records them) and the task's script, run as
// slurmstepd would. Real sshd daemons: ssh_launcher_test.sh; a real Slurm: slurm_cluster_test.sh.
#include "runtime/launch/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <optional>
#include <thread>

#include "dsgd/runtime/cluster.h"
#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"
#include "testing/temp_dir.h"

namespace dsgd::runtime {
namespace {

void expect_config_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL() << "no ConfigError; expected one saying '" << part << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Launcher, HostsAreNamesWithOptionalSlots) {
  const auto hosts = parse_hosts({"node1", "node2:3", "10.0.0.7", "gpu-box_4.example.org:1"});
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0].name, "node1");
  EXPECT_EQ(hosts[0].slots, 1);
  EXPECT_EQ(hosts[1].name, "node2");
  EXPECT_EQ(hosts[1].slots, 3);
  EXPECT_EQ(hosts[2].name, "10.0.0.7");
  EXPECT_EQ(hosts[3].slots, 1);
  expect_config_error([] { parse_hosts({"a:0"}); }, "slots must be a whole number");
  expect_config_error([] { parse_hosts({"a:two"}); }, "slots must be a whole number");
  expect_config_error([] { parse_hosts({"a:"}); }, "slots must be a whole number");
  expect_config_error([] { parse_hosts({":2"}); }, "names no host");
  expect_config_error([] { parse_hosts({"a;reboot"}); }, "ssh would read ';'");
  expect_config_error([] { parse_hosts({"$(x)"}); }, "ssh would read '$'");
  expect_config_error([] { parse_hosts({"a", "b", "a:2"}); }, "'a' is named twice");
}

TEST(Launcher, HostsFilesSkipCommentsAndBlankLinesAndRefuseTwoWordLines) {
  testing::TempDir dir;
  const std::string path = dir.file("hosts");
  std::ofstream(path) << "# the cluster\nnode1\n\n  node2:2   # the big one\n";
  EXPECT_EQ(read_hosts_file(path), (std::vector<std::string>{"node1", "node2:2"}));
  std::ofstream(path) << "node1 node2\n";
  expect_config_error([&] { read_hosts_file(path); }, "one host a line");
  std::ofstream(path) << "# nothing\n";
  expect_config_error([&] { read_hosts_file(path); }, "names no host");
  expect_config_error([&] { read_hosts_file(dir.file("missing")); }, "cannot be read");
}

TEST(Launcher, ConfigChecksSayWhatIsMissing) {
  register_builtin_operators();
  TrainerConfig c;
  c.num_workers = 2;
  c.launch.launcher = "ssh";
  auto check = [&] { validate_config(kImageClassifier, c); };
  expect_config_error(check, "launcher ssh needs hosts");
  c.launch.hosts = {"node1", "node2"};
  expect_config_error(check, "set listen to HOST:PORT");
  c.launch.listen = "0.0.0.0:29500";
  expect_config_error(check, "not 0.0.0.0");
  c.launch.listen = "10.1.2.3:0";
  check();  // complete
  c.recovery.standby_workers = 1;
  expect_config_error(check, "the hosts have 2 slot(s) for 3 worker(s)");
  c.launch.hosts = {"node1", "node2:2"};
  check();
  c.strategy = "ps";
  c.ps.placement = "processes";
  c.ps.shards = 2;  // a slot each
  expect_config_error(check, "the hosts have 3 slot(s) for 5 worker(s), standbys and ps shard processes");
  c.launch.hosts = {"node1:3", "node2:2"};
  check();
  c.launch.launcher = "mpirun";
  expect_config_error(check, "launcher mpirun starts the workers only");
  c.launch.launcher = "ssh";
  c.launch.hosts = {"node1", "node2:2"};
  c.strategy = "allreduce";
  c.ps.placement = "workers";
  c.launch.ssh_command = "  ";
  expect_config_error(check, "ssh_command is empty");
  c.launch.ssh_command = "ssh";
  c.launch.local_hosts = 2;
  expect_config_error(check, "local_hosts spreads workers");
  c.launch.local_hosts = 1;
  c.launch.launcher = "kubernetes";
  expect_config_error(check, "unknown launch.launcher 'kubernetes'; use auto, local, ssh, none, mpirun or slurm");
  c.launch.launcher = "mpirun";
  check();  // the same hosts and slots
  c.recovery.wait_for_replacements = true;
  expect_config_error(check, "cannot start a replacement");
  c.recovery.wait_for_replacements = false;
  c.launch.launcher = "local";
  expect_config_error(check, "hosts are where launcher ssh or mpirun starts workers");
  c.launch.hosts.clear();
  c.launch.launcher = "none";
  c.launch.listen.clear();
  expect_config_error(check, "launcher none: the workers join over TCP");
}

// Reads a file once it has a whole line (a process started in the background writes it).
std::string wait_for_line(const std::string& path) {
  for (int i = 0; i < 200; ++i) {
    std::ifstream in(path);
    std::string line;
    if (std::getline(in, line) && in.good()) return line;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return "";
}

bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(stat, all)) return true;
  const auto paren = all.rfind(')');
  return paren == std::string::npos || all.substr(paren + 2, 1) == "Z";  // a zombie is gone too
}

// Sets an environment variable for one test; puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { old_ ? (void)::setenv(name_, old_->c_str(), 1) : (void)::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Launcher, SlurmChecksSayWhatIsMissing) {
  register_builtin_operators();
  TrainerConfig c;
  c.num_workers = 2;
  c.launch.launcher = "slurm";
  auto check = [&] { validate_config(kImageClassifier, c); };
  {
    ScopedEnv none("SLURM_JOB_ID", "");
    expect_config_error(check, "SLURM_JOB_ID is not set: run the driver inside one (sbatch, or salloc");
  }
  ScopedEnv job("SLURM_JOB_ID", "42");
  expect_config_error(check, "set listen to HOST:PORT with a HOST the nodes reach");
  c.launch.listen = "node0:0";
  check();  // complete
  c.launch.srun_command = " ";
  expect_config_error(check, "srun_command is empty");
  c.launch.srun_command = "srun";
  c.launch.hosts = {"node1"};
  expect_config_error(check, "hosts are where launcher ssh or mpirun starts workers; launcher is 'slurm'");
  c.launch.hosts.clear();
  c.strategy = "ps";
  c.ps.placement = "processes";
  check();  // shard processes are job steps too
}

TEST(Launcher, SrunRunsOneTaskStepPerWorkerOnANodeButTheExcluded) {
  const auto args = srun_arguments({"srun", "--partition=cpu"}, {"node1", "node3"}, "/opt/dsgd",
                                   {"--dsgd-worker", "--spawn-index", "4"});
  ASSERT_EQ(args.size(), 14u);
  EXPECT_EQ(std::vector<std::string>(args.begin(), args.begin() + 7),
            (std::vector<std::string>{"--partition=cpu", "--nodes=1", "--ntasks=1", "--exclusive",
                                      "--job-name=dsgd-worker", "--exclude=node1,node3", "/bin/sh"}));
  EXPECT_EQ(std::vector<std::string>(args.begin() + 9, args.end()),
            (std::vector<std::string>{"dsgd-worker", "/opt/dsgd", "--dsgd-worker", "--spawn-index", "4"}));
  EXPECT_EQ(srun_arguments({"srun"}, {}, "/opt/dsgd", {})[3], "--job-name=dsgd-worker");  // no --exclude

  // The task as slurmstepd runs it: SLURMD_NODENAME set, srun's input on its standard input.
  testing::TempDir dir;
  const std::string out = dir.file("worker.out"), worker = dir.file("worker.sh");
  std::ofstream(worker) << "#!/bin/sh\necho \"$DSGD_TOKEN $DSGD_TLS $*\" > " << out << "\n";
  ::chmod(worker.c_str(), 0755);
  const auto task = srun_arguments({"srun"}, {}, worker, {"--dsgd-worker", "it's"});
  LocalProcesses p;
  p.spawn(task[4], std::vector<std::string>(task.begin() + 5, task.end()), {"SLURMD_NODENAME=node7"},
          JobSecrets{"tok-9", "tls-keys"}.input());
  EXPECT_EQ(wait_for_line(out), "tok-9 tls-keys --dsgd-worker it's --host-id node7");
  for (const auto& a : task) EXPECT_EQ(a.find("tok"), std::string::npos) << a;
}

TEST(Launcher, SlurmExcludesTheNodesThatLostAWorkerWhileOthersAreLeft) {
  testing::TempDir dir;
  const std::string fake = dir.file("srun"), log = dir.file("srun.log");
  // A stand-in srun: records its arguments and the token line it is given, then waits.
  std::ofstream(fake) << "#!/bin/sh\nIFS= read -r t\necho \"$t $*\" >> " << log << "\nexec sleep 600\n";
  ::chmod(fake.c_str(), 0755);
  ScopedEnv job("SLURM_JOB_ID", "42"), nodes("SLURM_JOB_NUM_NODES", "3");
  TrainerConfig c;
  c.launch.launcher = "slurm";
  c.launch.srun_command = fake + " --partition=cpu";
  LocalProcesses processes;
  auto launcher = make_launcher(c, processes, JobSecrets{"tok-1", ""});
  ASSERT_NE(launcher, nullptr);
  EXPECT_STREQ(launcher->name(), "slurm");
  auto start = [&](size_t lines) {
    const pid_t pid = launcher->start("/opt/dsgd", {"--dsgd-worker"}, {});
    for (int i = 0; i < 200; ++i) {
      std::ifstream in(log);
      std::vector<std::string> all;
      for (std::string l; std::getline(in, l);) all.push_back(l);
      if (all.size() == lines) return std::make_pair(pid, all.back());
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ADD_FAILURE() << "srun was not started";
    return std::make_pair(pid, std::string());
  };
  auto excluded = [](const std::string& line) {
    const auto at = line.find("--exclude=");
    return at == std::string::npos ? std::string() : line.substr(at + 10, line.find(' ', at) - at - 10);
  };
  auto [a, line_a] = start(1);
  EXPECT_EQ(line_a.rfind("tok-1 --partition=cpu --nodes=1 ", 0), 0u) << line_a;
  EXPECT_EQ(excluded(line_a), "");
  EXPECT_EQ(launcher->host_of(a), "a node of Slurm job 42");
  launcher->placed(a, "node1");
  auto [b, line_b] = start(2);
  EXPECT_EQ(excluded(line_b), "") << "no node lost a worker yet";
  launcher->placed(b, "node2");
  launcher->released(a, /*failed=*/true, "node1");
  processes.kill(a);
  // The lost worker's node, and (Slurm 22.05 would leave the step pending otherwise) the
  // busy one: node0 is left.
  auto [c2, line_c] = start(3);
  EXPECT_EQ(excluded(line_c), "node1,node2");
  EXPECT_EQ(launcher->host_of(c2), "a node of Slurm job 42 but node1,node2");
  launcher->placed(c2, "node0");
  launcher->released(b, /*failed=*/false, "node2");  // a shutdown, not a loss: node2 comes back
  auto [d, line_d] = start(4);
  EXPECT_EQ(excluded(line_d), "node1,node0");
  launcher->released(c2, /*failed=*/true, "node0");
  launcher->placed(d, "node2");
  // Lost and busy nodes are all 3: only the lost ones are excluded (the step waits for room).
  auto [e, line_e] = start(5);
  EXPECT_EQ(excluded(line_e), "node1,node0");
  // A third lost node would leave none of the 3 for a step: the oldest comes back.
  launcher->released(d, /*failed=*/true, "node2");
  EXPECT_EQ(excluded(start(6).second), "node0,node2");
}

TEST(Launcher, AProcessWithAStopSignalEndsByItBeforeSigkill) {
  testing::TempDir dir;
  const std::string out = dir.file("out");
  LocalProcesses p;
  // srun's way: a SIGTERM makes it end what it started, then itself.
  const pid_t pid = p.spawn("sh", {"-c", "trap 'echo cleaned > " + out + "; exit 0' TERM; echo up > " + out +
                                             "; while :; do sleep 0.05; done"},
                            {}, {}, SIGTERM);
  ASSERT_EQ(wait_for_line(out), "up");
  p.kill(pid);
  EXPECT_TRUE(p.gone(pid));
  EXPECT_EQ(wait_for_line(out), "cleaned");
}

// More than 8 local workers a core: they run below the driver's priority, so that it is heard; a
// job of a few a core keeps theirs.
TEST(Launcher, LocalWorkersCrowdingTheCoresRunBelowTheDriversPriority) {
  auto nice_of = [](pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(in, line);
    std::istringstream fields(line.substr(line.rfind(')') + 2));
    std::string f;
    for (int i = 0; i < 17; ++i) fields >> f;  // state is field 3; nice is field 19
    return std::stoi(f);
  };
  const int mine = nice_of(::getpid());
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  LocalProcesses p;
  for (int workers : {1, 8 * cores, 8 * cores + 1}) {
    TrainerConfig c;
    c.num_workers = workers;
    auto launcher = make_launcher(c, p, {});
    const pid_t pid = launcher->start("sleep", {"5"}, {});
    std::string comm;
    for (int i = 0; i < 200 && comm != "sleep"; ++i) {  // exec'd: its priority is set by then
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::ifstream("/proc/" + std::to_string(pid) + "/comm") >> comm;
    }
    EXPECT_EQ(nice_of(pid), workers > 8 * cores ? std::min(mine + 5, 19) : mine) << workers << " workers";
    p.kill(pid);
  }
}

TEST(Launcher, MpirunStartsEveryRankExportingTheTokenByName) {
  const auto args = mpirun_arguments({"mpirun", "--allow-run-as-root"}, parse_hosts({"a:2", "b"}), "/opt/dsgd",
                                     {"--dsgd-worker", "--spawn-index", "mpi:4"}, {"OMP_NUM_THREADS=2"}, 3);
  EXPECT_EQ(args, (std::vector<std::string>{"--allow-run-as-root", "-np", "3", "-x", "DSGD_TOKEN", "-x",
                                            "OMP_NUM_THREADS", "--mca", "orte_abort_on_non_zero_status", "0", "--host",
                                            "a:2,b:1", "/opt/dsgd", "--dsgd-worker", "--spawn-index", "mpi:4"}));
}

TEST(Launcher, AutoIsLocalWithoutListenAndNoneWithIt) {
  TrainerConfig c;
  EXPECT_EQ(launcher_of(c), Launcher::kLocal);
  EXPECT_EQ(driver_address(c, 4242), "127.0.0.1:4242");
  c.launch.listen = "198.18.0.1:0";
  EXPECT_EQ(launcher_of(c), Launcher::kNone);
  EXPECT_EQ(driver_address(c, 4242), "198.18.0.1:4242");
  c.launch.listen = "0.0.0.0:29500";
  EXPECT_EQ(driver_address(c, 29500), "127.0.0.1:29500");
}

TEST(Launcher, SpawnHandsStandardInputDataAndKeepsItOpen) {
  testing::TempDir dir;
  const std::string out = dir.file("out");
  LocalProcesses p;
  // Reads one line, writes it out, then waits for the end of its input.
  const pid_t pid =
      p.spawn("sh", {"-c", "IFS= read -r x; echo \"got $x\" > " + out + "; cat >/dev/null; echo eof >> " + out}, {},
              "the-token\n");
  EXPECT_EQ(wait_for_line(out), "got the-token");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(p.gone(pid)) << "its standard input ended while the process was ours";
  p.kill(pid);
}

TEST(Launcher, SshScriptGetsTheTokenOnStandardInputAndEndsTheWorkerWithIt) {
  testing::TempDir dir;
  const std::string out = dir.file("worker.out"), worker = dir.file("worker.sh");
  std::ofstream(worker) << "#!/bin/sh\necho \"$$ $DSGD_TOKEN ${DSGD_TLS-no-tls} $OMP_NUM_THREADS $*\" > " << out
                        << "\nexec sleep 600\n";
  ::chmod(worker.c_str(), 0755);
  const auto args = ssh_arguments({"ssh", "-p", "2222"}, "node1", worker, {"--dsgd-worker", "--driver", "h:1", "it's"},
                                  {"OMP_NUM_THREADS=3"});
  ASSERT_GE(args.size(), 6u);
  EXPECT_EQ(std::vector<std::string>(args.begin(), args.begin() + 7),
            (std::vector<std::string>{"-p", "2222", "-o", "BatchMode=yes", "-T", "node1", "--"}));
  for (const auto& a : args) EXPECT_EQ(a.find("tok"), std::string::npos) << a;
  // What sshd does with the last argument: the user's shell runs it, in a session of its own
  // (here: cut off from our process group), its input the client's.
  const std::string remote = args.back();
  LocalProcesses p;
  const pid_t client =
      p.spawn("sh", {"-c", "cat | setsid sh -c \"$0\"", remote}, {}, JobSecrets{"tok-123", ""}.input());
  const std::string line = wait_for_line(out);
  ASSERT_FALSE(line.empty()) << "the worker never ran";
  EXPECT_NE(line.find(" tok-123 no-tls 3 --dsgd-worker --driver h:1 it's"), std::string::npos) << line;
  const pid_t worker_pid = std::stoi(line);
  EXPECT_FALSE(process_gone(worker_pid));
  p.kill(client);  // the client's end: its input closes
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = process_gone(worker_pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(gone) << "the worker outlived its ssh client";
  if (!gone) ::kill(worker_pid, SIGKILL);
}

// ---- cluster specs (dsgd/runtime/cluster.h) ----

std::string spec(const std::string& cluster, const std::string& task) {
  return "{\"cluster\": " + cluster + ", \"task\": " + task + "}";
}
const std::string kCluster =
    R"({"chief": ["hostA:29500"], "worker": ["hostB", "hostC:1", "hostC:2"], "ps": ["hostD"]})";

TEST(ClusterSpec, EachTaskKnowsTheDriverAndItsHost) {
  const auto w = ClusterSpec::parse(spec(kCluster, R"({"type": "worker", "index": 2})"), "spec");
  EXPECT_EQ(w.chief, "hostA:29500");
  EXPECT_EQ(w.workers.size(), 3u);
  EXPECT_EQ(w.ps, (std::vector<std::string>{"hostD"}));
  EXPECT_EQ(w.task_name(), "worker 2");
  EXPECT_EQ(w.task_entry(), "hostC:2");
  EXPECT_EQ(w.task_host(), "hostC");  // shares memory with worker 1
  const auto chief = ClusterSpec::parse(spec(kCluster, R"({"type": "chief"})"), "spec");
  EXPECT_EQ(chief.task_index, 0);
  EXPECT_EQ(chief.task_host(), "hostA");
}

TEST(ClusterSpec, BadSpecsSayWhatIsWrong) {
  auto bad = [](const std::string& text, const std::string& part) {
    expect_config_error([&] { ClusterSpec::parse(text, "cluster spec x.json"); }, part);
  };
  const std::string worker0 = R"({"type": "worker", "index": 0})";
  bad("{", "cluster spec x.json is not valid JSON");
  bad(R"({"task": {"type": "chief"}})", R"(needs {"cluster")");
  bad(spec(R"({"chief": ["a:1"], "worker": ["b"], "master": ["c"]})", worker0), "unknown role 'master'");
  bad(spec(R"({"worker": ["b"]})", worker0), "cluster.chief is missing");
  bad(spec(R"({"chief": ["a:1", "a:2"], "worker": ["b"]})", worker0), "exactly one HOST:PORT");
  bad(spec(R"({"chief": ["a"], "worker": ["b"]})", worker0), "cluster.chief must be HOST:PORT");
  bad(spec(R"({"chief": ["a:1"], "worker": []})", worker0), "at least one worker");
  bad(spec(R"({"chief": ["a:1"], "worker": ["b", "c", "b"]})", worker0), "'b' is named twice (worker 0 and worker 2)");
  bad(spec(R"({"chief": ["a:1"], "worker": ["a:1"]})", worker0), "'a:1' is named twice (chief 0 and worker 0)");
  bad(spec(R"({"chief": ["a:1"], "worker": ["b c"]})", worker0), "a host holds letters");
  bad(spec(R"({"chief": ["a:1"], "worker": [7]})", worker0), R"(list of "HOST" or "HOST:PORT" strings)");
  bad(spec(R"({"chief": ["a:1"], "worker": ["b"], "evaluator": ["e", "f"]})", worker0), "at most one evaluator");
  bad(spec(kCluster, R"({"type": "worker", "index": 3})"),
      "task worker 3 is not in the cluster (it has 3 worker entries)");
  bad(spec(kCluster, R"({"type": "evaluator"})"), "task evaluator 0 is not in the cluster");
  bad(spec(kCluster, R"({"type": "driver"})"), "unknown task.type 'driver'");
  bad(spec(kCluster, R"({"type": "ps", "index": "0"})"), "task.index must be a whole number");
  bad(spec(kCluster, R"({"index": 0})"), R"(needs "task")");
}

TEST(ClusterSpec, LoadReadsTheFileElseDsgdCluster) {
  testing::TempDir dir;
  ::unsetenv("DSGD_CLUSTER");
  EXPECT_FALSE(ClusterSpec::load("").has_value());
  ::setenv("DSGD_CLUSTER", spec(kCluster, R"({"type": "ps"})").c_str(), 1);
  EXPECT_EQ(ClusterSpec::load("")->task_name(), "ps 0");
  const std::string path = dir.file("spec.json");
  std::ofstream(path) << spec(kCluster, R"({"type": "worker", "index": 1})");
  EXPECT_EQ(ClusterSpec::load(path)->task_name(), "worker 1");  // the file wins
  ::unsetenv("DSGD_CLUSTER");
  expect_config_error([&] { ClusterSpec::load(dir.file("missing.json")); }, "cannot be read");
}

// $TF_CONFIG after $DSGD_CLUSTER; then the variables torchrun, PyTorchJob, an Indexed Job and
// Slurm set: rank 0 the chief at MASTER_ADDR:MASTER_PORT (the next port under torchrun, or
// $DSGD_DRIVER_PORT), rank r worker r - 1, the node as the host; nothing without MASTER_ADDR.
TEST(ClusterSpec, LoadReadsTfConfigThenTheEnvironmentAnEngineSets) {
  const char* const vars[] = {"DSGD_CLUSTER", "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                              "JOB_COMPLETION_INDEX", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODEID", "GROUP_RANK",
                              "TORCHELASTIC_RUN_ID", "DSGD_DRIVER_PORT"};
  const auto clear = [&] {
    for (const char* v : vars) ::unsetenv(v);
  };
  clear();
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  EXPECT_FALSE(ClusterSpec::load("").has_value()) << "no MASTER_ADDR: no engine";
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  expect_config_error([] { ClusterSpec::load(""); }, "but not $MASTER_PORT");
  ::setenv("MASTER_PORT", "29500", 1);
  auto s = ClusterSpec::load("");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->chief, "10.0.0.7:29500");
  EXPECT_EQ(s->task_name(), "worker 0");
  EXPECT_EQ(s->workers.size(), 2u);
  EXPECT_TRUE(s->from_engine);
  ::setenv("TORCHELASTIC_RUN_ID", "job", 1);
  ::setenv("GROUP_RANK", "4", 1);
  s = ClusterSpec::load("");
  EXPECT_EQ(s->chief, "10.0.0.7:29501") << "torchrun's agent may hold MASTER_PORT";
  EXPECT_EQ(s->task_host(), "node4");
  ::setenv("DSGD_DRIVER_PORT", "31000", 1);
  EXPECT_EQ(ClusterSpec::load("")->chief, "10.0.0.7:31000");
  clear();
  ::setenv("MASTER_ADDR", "head", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  s = ClusterSpec::load("");
  EXPECT_EQ(s->task_name(), "chief 0");
  EXPECT_EQ(s->workers.size(), 3u);
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NODEID", "1", 1);
  EXPECT_EQ(ClusterSpec::load("")->task_entry(), "node1");
  ::setenv("JOB_COMPLETION_INDEX", "3", 1);  // before Slurm's
  EXPECT_EQ(ClusterSpec::load("")->task_name(), "worker 2");
  ::setenv("SLURM_NTASKS", "x", 1);
  expect_config_error([] { ClusterSpec::load(""); }, "$SLURM_NTASKS is 'x'");
  ::setenv("TF_CONFIG", spec(kCluster, R"({"type": "worker", "index": 1})").c_str(), 1);
  EXPECT_EQ(ClusterSpec::load("")->source, "$TF_CONFIG");
  EXPECT_FALSE(ClusterSpec::load("")->from_engine);
  ::setenv("DSGD_CLUSTER", spec(kCluster, R"({"type": "ps"})").c_str(), 1);
  EXPECT_EQ(ClusterSpec::load("")->task_name(), "ps 0");  // dsgd's own first
  clear();
}

}  // namespace
}  // namespace dsgd::runtime
