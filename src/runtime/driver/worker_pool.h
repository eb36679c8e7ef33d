// The driver's workers: which registered workers form the current group (members, in rank
// order), which wait outside it set up and ready to take a lost member's place (standbys, and
// replacements that came too late to be awaited), and, when the driver starts its workers
// (launcher local or ssh, runtime/launch/launcher.h), the processes behind them: the job's first
// workers (local: spread over pseudo-hosts), standbys, and new processes after a loss, started
// with exponential back-off. Each started worker gets a spawn index, which it reports when it
// registers: that ties a registered worker to the local process standing for it (itself, or
// its ssh client). The recovery protocol (recovery.cpp) decides when; this
// decides who and where. Torch-free.
//
//   WorkerPool pool(config, server, binary, {token, tls});
//   pool.spawn_initial();                                 // when pool.spawns()
//   server.wait_registered(timeout, [&] { pool.check_children(); }, pool.initial_count());
//   pool.choose_members();
//   ...                                                   // while training, every ~100 ms:
//   pool.check_children();
//   pool.tend(generation, signature);                     // newcomers set up in the background
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/driver_service.h"
#include "runtime/launch/launcher.h"
#include "runtime/launch/spawn.h"

namespace dsgd::runtime {

class WorkerPool {
 public:
  // `binary` and `secrets`: what started workers run, and what they get to join. Keeps references
  // to `config` and `server`, which must outlive the pool.
  WorkerPool(const TrainerConfig& config, control::DriverServer& server, std::string binary,
             const JobSecrets& secrets);

  // The driver starts its workers (launcher local or ssh); otherwise someone else does (none).
  bool spawns() const { return launcher_ != nullptr; }

  const std::vector<int>& members() const { return members_; }
  bool is_member(int id) const;
  // Registrations the start waits for: every process spawn_initial started; or, when the driver
  // starts none, num_workers, or recovery.min_workers where set (the rest, and standbys, join
  // when they come).
  int initial_count() const;
  // The start's group: the registered workers but the standbys spawn_initial started (left to
  // tend); those the driver started in the order it started them, so the layout over
  // pseudo-hosts is the same in every run.
  void choose_members();
  // Appends `ids` to the group (out of ready(), where they were).
  void add_members(const std::vector<int>& ids);
  // Takes worker `id` out of the group; its process, if the driver started it, is killed.
  void drop(int id);
  // Where every member sits in `generation`: its position among the members, in order, and with
  // local_hosts > 1 its pseudo-host.
  proto::Placement placement(int64_t generation) const;

  // Registered workers outside the group are set up while the job goes on: tend() sends each
  // its setup (a placement of `generation`, position 0) and collects it when done; one whose
  // models' `signature` differs from the members', or whose setup fails, is evicted with an
  // error logged, as is one lost meanwhile (local mode: a new process follows, with back-off).
  // Does nothing before the members' signature is known (empty).
  void tend(int64_t generation, const std::string& signature);
  // Set-up workers outside the group, in the order they became ready.
  const std::vector<int>& ready() const { return ready_; }
  bool preparing() const { return !preparing_.empty(); }
  // A ready worker takes member `lost`'s place: its position in the group and its pseudo-host
  // (launcher local). The lost worker's process, if the driver started it, is killed. False
  // when none is ready.
  bool promote(int lost);
  // The first `n` (at most) of ready(): to add_members, which takes them out of it.
  std::vector<int> first_ready(size_t n) const;

  // num_workers workers (launcher local: worker i on pseudo-host i % local_hosts), standby_workers
  // standbys after them, and the ps shard processes (spawn_servers).
  void spawn_initial();
  // Strategy ps with shard processes (launcher local, ssh or slurm): starts those not running
  // (every one at first, a lost one during recovery); local: shard s on pseudo-host
  // s % local_hosts; ssh: on a host with a free slot; slurm: as a job step.
  void spawn_servers();
  // True if the process the driver started for worker `id` has exited (it is reaped).
  bool exited(int id);
  // When every started process was last seen running: one found exited since ended after it.
  std::chrono::steady_clock::time_point all_running_at() const { return children_.all_running_at(); }
  // Liveness of spawned workers, checked while waiting on them. A member's or a shard process's
  // exit throws CommError (the job recovers); a pending replacement's or an outsider's (standby,
  // one being set up) only defers the next attempt. A worker that exits by itself before
  // registering throws CommError with op() "worker start" (a wrong binary or set-up: starting
  // again would not help).
  void check_children();
  // Below num_workers + standby_workers registered (when the driver starts its workers): starts
  // the missing ones, unless some are still pending or the back-off since a failed attempt has
  // not passed.
  void spawn_replacements();
  // While held (a recovery re-forming the group), spawn_replacements starts nothing: new
  // processes loading LibTorch and building the model would take the cores the re-forming needs.
  void hold_spawns(bool held) { spawns_held_ = held; }
  bool replacements_pending() const { return !pending_.empty(); }
  // Resident memory of worker `id`'s process in bytes (launcher local, Linux), 0 if unknown.
  int64_t resident_bytes(int id) const;
  // Back to num_workers: the next failed attempt waits the initial back-off again.
  void reset_backoff() { backoff_ = std::chrono::milliseconds(1000); }
  // Shutdown: up to `grace_ms` for spawned workers to exit by themselves, then SIGKILL.
  void stop(int grace_ms);
  // A driver that restarts in place (TrainerConfig::recovery.driver_state_dir) keeps who is in the
  // group and who stands by (kept()), and its successor takes them up (adopt(): the members in
  // order, the standbys ready, their processes watched, not reaped: not its children).
  struct Kept {
    int id = -1;
    int64_t spawn_index = -1;
    pid_t pid = 0;          // the process the driver started for it; 0 where it started none
    int pseudo_host = -1;   // launch.local_hosts > 1
    bool member = true;     // false: a ready standby
  };
  std::vector<Kept> kept() const;
  int64_t next_spawn_index() const { return next_spawn_index_; }
  void adopt(const std::vector<Kept>& workers, int64_t next_spawn_index);
  // A start-up that lost a process (when the driver starts its workers): kills every started
  // process (workers and shard processes) and starts them all again, as spawn_initial. Members
  // are cleared.
  void restart();

 private:
  pid_t spawn_worker(int host = -1);
  int pseudo_host_for_next() const;
  void defer_replacements(const std::string& why);
  // Worker `id`, outside the group, is out of the job (evicted; its process killed): `why`.
  void discard(int id, const std::string& why);
  // The local process the driver started for worker `id` (through its spawn index), 0 if none.
  pid_t pid_of(int id) const;
  // Kills the process `pid` the driver started; `failed`: a loss (its host, the one its worker
  // registered from, is avoided).
  void end_process(pid_t pid, bool failed);
  void end_process(pid_t pid, bool failed, const std::string& host);
  // Where the worker behind `pid` said it ran when it registered; "" if none did.
  std::string registered_host(pid_t pid) const;
  // Worker `id` is out: its process is killed unless it stands for other workers too (mpirun).
  void end_worker(int id, bool failed);
  // The environment every started worker gets (besides the secrets).
  std::vector<std::string> worker_env() const;

  const TrainerConfig& config_;
  control::DriverServer& server_;
  const std::string binary_;
  LocalProcesses children_;
  std::unique_ptr<ProcessLauncher> launcher_;  // nullptr: launcher none
  int64_t next_spawn_index_ = 0;
  std::map<int64_t, pid_t> launched_;   // spawn index -> the local process standing for the worker
  std::vector<int> members_;
  std::vector<int> ready_;                                   // set up, outside the group
  std::map<int, control::DriverServer::Pending> preparing_;  // outside the group, setup sent
  int64_t initial_base_ = 0;  // spawn_initial's first spawn index: workers, then standbys
  int said_short_of_ = -1;     // mpirun: the worker count last said to go on with
  std::vector<pid_t> pending_;  // replacements spawned, not yet registered
  std::chrono::steady_clock::time_point pending_since_{}, next_spawn_{};
  bool spawns_held_ = false;  // hold_spawns
  std::chrono::milliseconds backoff_{1000};
  std::map<pid_t, int>
      pseudo_host_;  // local_hosts > 1: each spawned worker's pseudo-host (a promoted standby: its predecessor's)
  std::map<pid_t, int> servers_;      // running ps shard processes: pid -> shard
};

}  // namespace dsgd::runtime
