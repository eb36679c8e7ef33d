// How the driver starts worker processes (TrainerConfig::launcher). Every start is a process on
// this host whose life is the worker's: the worker itself (local); the ssh client running it on
// one of TrainerConfig::launch.hosts (ssh), or the srun running it as a job step on a node of the Slurm
// allocation (slurm), which exits with the worker's status and whose end (or the driver's) ends
// the worker; or, for a launcher that starts them all at once (mpirun), one process whose life
// is theirs together. So WorkerPool watches, kills and reaps local processes
// whichever the launcher; the launcher decides what runs and where. Torch-free.
//
//   auto launcher = make_launcher(config, processes, {token, tls});  // nullptr: launcher none
//   pid_t pid = launcher->start(binary, {"--dsgd-worker", "--driver", address, ...}, env);
//   ...
//   launcher->released(pid, /*failed=*/true, "node1");              // node1 is avoided
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/tls.h"
#include "runtime/launch/spawn.h"

namespace dsgd::runtime {

// The launcher TrainerConfig asks for, auto resolved: local without `listen`, none with it.
dsgd::Launcher launcher_of(const TrainerConfig& config);

// A launcher's own rules, checked by the Trainer's validation (dsgd::validate_config): hosts only
// for ssh and mpirun, local_hosts only for local, listen for none and for the launchers whose
// workers reach the driver from elsewhere (a HOST they reach), enough slots for every process,
// slurm inside an allocation, a non-empty command; TLS key files all or none, and TLS on only where
// the job can have it. ConfigError naming the field.
void validate_launcher(const TrainerConfig& config);

// Whether the driver starts every process of the job itself (launcher local without listen, ssh,
// mpirun, slurm), so that keys it makes reach them all (TrainerConfig::launch.tls auto).
bool starts_every_process(const TrainerConfig& config);

// The job's TLS keys (TrainerConfig::launch.tls): the files' when given; else, unless off, a CA
// made for this job where the driver starts every process; else none (plaintext: auto warns,
// naming what to do). ConfigError for unreadable or mismatched files.
control::TlsKeys job_tls_keys(const TrainerConfig& config);

// A host of TrainerConfig::launch.hosts: "name" or "name:slots" (slots >= 1, default 1).
struct HostSlots {
  std::string name;
  int slots = 1;
};
// ConfigError naming the entry for a bad one: empty, a character a shell or ssh would read
// differently (space, quote, $, ;, ...), slots not a whole number >= 1, or a host named twice.
std::vector<HostSlots> parse_hosts(const std::vector<std::string>& entries);

// `command` split at spaces.
std::vector<std::string> words_of(const std::string& command);

// `listen`'s host when workers elsewhere can reach it by that name: "" for none or a wildcard
// (0.0.0.0, ::).
std::string reachable_listen_host(const TrainerConfig& config);
// The driver's address as its workers reach it: reachable_listen_host (else 127.0.0.1) and the
// port the driver bound.
std::string driver_address(const TrainerConfig& config, int port);

// What a started worker needs to join the job and must never show on a command line: the job
// token and, with TLS, the job's keys as one line (control::encode_keys; "" without TLS).
struct JobSecrets {
  std::string token;
  std::string tls;
  // "DSGD_TOKEN=..." and, with TLS, "DSGD_TLS=...": a local process's environment.
  std::vector<std::string> environment() const;
  // What a remote shell reads from its standard input first (ssh, srun): the token's line, then
  // the keys' (empty without TLS).
  std::string input() const;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  virtual const char* name() const = 0;
  // Starts `binary` with `args` and `env` ("NAME=value") plus the job's secrets as a worker; the
  // launcher adds where it runs (ssh: --host-id <host>; slurm: --host-id <its node>). Returns
  // the local process standing for it. Throws dsgd::Error when it cannot start one (ssh: no
  // host has a free slot).
  virtual pid_t start(const std::string& binary, std::vector<std::string> args, std::vector<std::string> env) = 0;
  // The process `pid` that start() returned is gone or given up: its slot is free again;
  // `failed` (a lost worker, not a shutdown): its host is avoided while another has room.
  // `host`: where the worker said it ran when it registered ("" if it never did).
  virtual void released(pid_t pid, bool failed, const std::string& host) { (void)pid, (void)failed, (void)host; }
  // The worker behind `pid` registered from `host` (told again before every start).
  virtual void placed(pid_t pid, const std::string& host) { (void)pid, (void)host; }
  // Where `pid` runs, for the log ("" where the launcher does not know).
  virtual std::string host_of(pid_t pid) const { (void)pid; return {}; }
  // Launchers that start every worker at once (mpirun) and none later: start_all() starts
  // `count` of them in one process, each with `args` (whose "--spawn-index mpi:B" it turns into
  // B + its rank); start() is not theirs.
  virtual bool starts_all_at_once() const { return false; }
  virtual pid_t start_all(const std::string& binary, const std::vector<std::string>& args,
                          std::vector<std::string> env, int count);
};

// nullptr for launcher none. Keeps a reference to `processes`, which must outlive it.
std::unique_ptr<ProcessLauncher> make_launcher(const TrainerConfig& config, LocalProcesses& processes,
                                               const JobSecrets& secrets);

// mpirun's arguments (`mpirun_command` after its program) that start `count` ranks of `binary
// args` on `hosts` (none: mpirun's choice), exporting `env`'s names and DSGD_TOKEN from its
// environment. Exposed for tests.
std::vector<std::string> mpirun_arguments(const std::vector<std::string>& mpirun_command,
                                          const std::vector<HostSlots>& hosts, const std::string& binary,
                                          const std::vector<std::string>& args, const std::vector<std::string>& env,
                                          int count);

// srun's arguments (`srun_command` after its program) that run `binary args` as one job step of
// one task on one node but those in `exclude`, reading the secrets (JobSecrets::input) from
// standard input first and adding --host-id <the node's name>. Exposed for tests.
std::vector<std::string> srun_arguments(const std::vector<std::string>& srun_command,
                                        const std::vector<std::string>& exclude, const std::string& binary,
                                        const std::vector<std::string>& args);

// The ssh client's arguments that run `binary args` on `host` with `env` exported, reading the
// secrets (JobSecrets::input) from standard input first, and killing the worker when standard input ends
// (the client or the driver gone). Exposed for tests.
std::vector<std::string> ssh_arguments(const std::vector<std::string>& ssh_command, const std::string& host,
                                       const std::string& binary, const std::vector<std::string>& args,
                                       const std::vector<std::string>& env);

}  // namespace dsgd::runtime
