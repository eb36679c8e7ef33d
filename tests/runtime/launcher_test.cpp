// Launchers without a network: hosts entries and files, the launcher's config checks, the
// LocalProcesses standard input that carries the token, and the ssh launcher's remote script run
// by a stand-in for ssh (a local shell in a session of its own, fed by a pipe as sshd feeds the
// remote side): the token arrives on standard input and never on a command line, and the end of
// that input (the client killed) kills the worker. Real sshd daemons: ssh_launcher_test.sh.
#include "runtime/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dsgd/cluster.h"
#include "dsgd/error.h"
#include "dsgd/image_classifier.h"
#include "runtime/trainer_config.h"
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
  c.launcher = "ssh";
  auto check = [&] { validate_trainer_config(kImageClassifier, c); };
  expect_config_error(check, "launcher ssh needs hosts");
  c.hosts = {"node1", "node2"};
  expect_config_error(check, "set listen to HOST:PORT");
  c.listen = "0.0.0.0:29500";
  expect_config_error(check, "not 0.0.0.0");
  c.listen = "10.1.2.3:0";
  check();  // complete
  c.standby_workers = 1;
  expect_config_error(check, "the hosts have 2 slot(s) for 3 worker(s)");
  c.hosts = {"node1", "node2:2"};
  check();
  c.strategy = "ps";
  c.ps_placement = "processes";
  expect_config_error(check, "does not start ps shard processes");
  c.strategy = "allreduce";
  c.ps_placement = "workers";
  c.ssh_command = "  ";
  expect_config_error(check, "ssh_command is empty");
  c.ssh_command = "ssh";
  c.local_hosts = 2;
  expect_config_error(check, "local_hosts spreads workers");
  c.local_hosts = 1;
  c.launcher = "slurm";
  expect_config_error(check, "unknown launcher 'slurm'; use auto, local, ssh, none or mpirun");
  c.launcher = "mpirun";
  check();  // the same hosts and slots
  c.wait_for_replacements = true;
  expect_config_error(check, "cannot start a replacement");
  c.wait_for_replacements = false;
  c.launcher = "local";
  expect_config_error(check, "hosts are where launcher ssh or mpirun starts workers");
  c.hosts.clear();
  c.launcher = "none";
  c.listen.clear();
  expect_config_error(check, "launcher none: the workers join over TCP");
}

TEST(Launcher, MpirunStartsEveryRankExportingTheTokenByName) {
  const auto args = mpirun_arguments({"mpirun", "--allow-run-as-root"}, parse_hosts({"a:2", "b"}), "/opt/dsgd",
                                     {"--dsgd-worker", "--spawn-index", "mpi:4"}, {"OMP_NUM_THREADS=2"}, 3);
  EXPECT_EQ(args, (std::vector<std::string>{"--allow-run-as-root", "-np", "3", "-x", "DSGD_TOKEN", "-x", "OMP_NUM_THREADS",
                                            "--mca", "orte_abort_on_non_zero_status", "0", "--host", "a:2,b:1",
                                            "/opt/dsgd", "--dsgd-worker", "--spawn-index", "mpi:4"}));
}

TEST(Launcher, AutoIsLocalWithoutListenAndNoneWithIt) {
  TrainerConfig c;
  EXPECT_EQ(launcher_of(c), Launcher::kLocal);
  EXPECT_EQ(driver_address(c, 4242), "127.0.0.1:4242");
  c.listen = "198.18.0.1:0";
  EXPECT_EQ(launcher_of(c), Launcher::kNone);
  EXPECT_EQ(driver_address(c, 4242), "198.18.0.1:4242");
  c.listen = "0.0.0.0:29500";
  EXPECT_EQ(driver_address(c, 29500), "127.0.0.1:29500");
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

TEST(Launcher, SpawnHandsStandardInputDataAndKeepsItOpen) {
  testing::TempDir dir;
  const std::string out = dir.file("out");
  LocalProcesses p;
  // Reads one line, writes it out, then waits for the end of its input.
  const pid_t pid = p.spawn("sh", {"-c", "IFS= read -r x; echo \"got $x\" > " + out + "; cat >/dev/null; echo eof >> " + out},
                            {}, "the-token\n");
  EXPECT_EQ(wait_for_line(out), "got the-token");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(p.gone(pid)) << "its standard input ended while the process was ours";
  p.kill(pid);
}

TEST(Launcher, SshScriptGetsTheTokenOnStandardInputAndEndsTheWorkerWithIt) {
  testing::TempDir dir;
  const std::string out = dir.file("worker.out"), worker = dir.file("worker.sh");
  std::ofstream(worker) << "#!/bin/sh\necho \"$$ $DSGD_TOKEN $OMP_NUM_THREADS $*\" > " << out << "\nexec sleep 600\n";
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
  const pid_t client = p.spawn("sh", {"-c", "cat | setsid sh -c \"$0\"", remote}, {}, "tok-123\n");
  const std::string line = wait_for_line(out);
  ASSERT_FALSE(line.empty()) << "the worker never ran";
  EXPECT_NE(line.find(" tok-123 3 --dsgd-worker --driver h:1 it's"), std::string::npos) << line;
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

// ---- cluster specs (dsgd/cluster.h) ----

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
  bad(spec(kCluster, R"({"type": "worker", "index": 3})"), "task worker 3 is not in the cluster (it has 3 worker entries)");
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

}  // namespace
}  // namespace dsgd::runtime
